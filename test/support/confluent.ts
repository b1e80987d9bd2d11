import { confluentInstalled } from '../../src/kafka/confluentModule.js';

/**
 * Whether @confluentinc/kafka-javascript can be loaded here. It is an optional peer dependency
 * that CI does not install (its install builds librdkafka): tests of it skip without it, and
 * say so on stderr, since a skipped file's describe names are not printed.
 */
export async function confluentForTests(file: string): Promise<boolean> {
  const installed = await confluentInstalled();
  if (!installed) {
    console.warn(
      `${file}: skipped, @confluentinc/kafka-javascript is not installed (optional peer; ` +
        '`npm install --no-save @confluentinc/kafka-javascript@1` to run it)',
    );
  }
  return installed;
}
