import { readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { sourceFiles, specifiers } from './imports.js';

/**
 * Kafka sits behind Publisher, Subscriber and KafkaAdmin (src/kafka/): kafkajs is in
 * maintenance mode, and another client must be able to replace it by adding one
 * implementation there. So no module of the library or of what ships with it (relay/,
 * consumers/, console/, langgraph/, cli/) names a Kafka client; only src/kafka/ does, and the
 * local stack (cli/stack/), which runs a broker and probes it. Scripts, benches and tests may.
 */
const KAFKA_CLIENTS = ['kafkajs', '@platformatic/kafka'];
const shipped = ['src', 'relay', 'consumers', 'console', 'langgraph', 'cli'];
const allowed = ['src/kafka/', 'cli/stack/'];

/** The imports of `file` that name a Kafka client, as `file -> specifier`. */
function violations(file: string, text: string): string[] {
  const path = relative(repoRoot, file);
  if (allowed.some((dir) => path.startsWith(dir))) return [];
  return specifiers(text)
    .filter((spec) => KAFKA_CLIENTS.some((c) => spec === c || spec.startsWith(`${c}/`)))
    .map((spec) => `${path} -> ${spec}`);
}

describe('layering: only src/kafka/ imports a Kafka client', () => {
  it('no module of relay/, consumers/, console/, langgraph/, cli/ or src/ outside src/kafka/ imports kafkajs or @platformatic/kafka', () => {
    const files = shipped.flatMap((dir) => sourceFiles(join(repoRoot, dir)));
    // The scan must see the clients where they are allowed, or it proves nothing.
    const named = files.filter((f) =>
      specifiers(readFileSync(f, 'utf8')).some((s) => KAFKA_CLIENTS.includes(s)),
    );
    expect(named.map((f) => relative(repoRoot, f))).toEqual(
      expect.arrayContaining(['src/kafka/kafkajsAdmin.ts', 'src/kafka/platformaticAdmin.ts']),
    );
    expect(files.flatMap((f) => violations(f, readFileSync(f, 'utf8')))).toEqual([]);
  });

  it('the check catches each way such an import can be written', () => {
    const text = [
      "import type { Kafka } from 'kafkajs';",
      "import { Admin } from '@platformatic/kafka';",
      "export { Consumer } from '@platformatic/kafka/dist/clients/consumer/index.js';",
      "const k = await import('kafkajs');",
      // Allowed: Cairn's own seam, and names that only look alike.
      "import { createKafkaAdmin } from '../kafka/admin.js';",
      "import { something } from 'kafkajs-extra';",
    ].join('\n');
    expect(violations(join(repoRoot, 'src', 'recovery', 'example.ts'), text)).toEqual([
      'src/recovery/example.ts -> kafkajs',
      'src/recovery/example.ts -> @platformatic/kafka',
      'src/recovery/example.ts -> @platformatic/kafka/dist/clients/consumer/index.js',
      'src/recovery/example.ts -> kafkajs',
    ]);
    expect(violations(join(repoRoot, 'src', 'kafka', 'example.ts'), text)).toEqual([]);
    expect(violations(join(repoRoot, 'cli', 'stack', 'example.ts'), text)).toEqual([]);
  });
});
