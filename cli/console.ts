import { parseArgs } from 'node:util';
import { usersFromFileOrEnv } from '../console/auth.js';
import { startConsole } from '../console/server.js';
import { assertReachable, createDb } from '../src/db/database.js';
import { databaseUrlFromEnv, kafkaBrokersFromEnv } from '../src/env.js';
import { createKafkaPublisher } from '../src/kafka/publisher.js';
import { createLogger } from '../src/logger.js';
import { checkpointKeysFromEnv } from './checkpointKeys.js';
import { exitTwoOnBadInput } from './operatorInput.js';
import { UsageError } from './output.js';

/**
 * `cairn console`: the operator console on 127.0.0.1:7070 until SIGTERM/SIGINT. Users from
 * --users FILE or CAIRN_CONSOLE_USERS; DATABASE_URL; KAFKA_BROKERS (for dead-letter replay);
 * CAIRN_CHECKPOINT_KEYS and CAIRN_KEYRING to check signatures and read encrypted snapshots.
 */
export function consoleCommand(argv: string[]): Promise<number> {
  return exitTwoOnBadInput(async () => {
    const { values, positionals } = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string', default: '7070' },
        users: { type: 'string' },
        keyring: { type: 'string' },
      },
    });
    const port = Number(values.port);
    if (positionals.length > 0 || !Number.isInteger(port) || port < 0 || port > 65535) {
      throw new UsageError(
        `usage: cairn console [--host 127.0.0.1] [--port 7070] [--users FILE]${
          positionals.length
            ? ` (unexpected ${positionals.join(' ')})`
            : ` (--port "${values.port}" is not a port)`
        }`,
      );
    }
    const users = usersFromFileOrEnv(values.users);
    const logger = createLogger({ name: 'cairn-console' });
    const url = databaseUrlFromEnv();
    const brokers = kafkaBrokersFromEnv();
    const db = createDb({ connectionString: url, max: 6, applicationName: 'cairn-console' });
    await assertReachable(db, url);
    const running = await startConsole({
      db,
      users,
      host: values.host,
      port,
      checkpointKeys: checkpointKeysFromEnv(db, values.keyring),
      publisher: () => createKafkaPublisher({ brokers, clientId: 'cairn-console' }),
      logger,
    });
    logger.info({ url: running.url, users: users.map((u) => `${u.name}:${u.role}`) }, 'console listening');
    console.log(`cairn console on ${running.url} (${users.length} user(s); stop with Ctrl-C)`);
    await new Promise<void>((resolve) => {
      process.once('SIGTERM', resolve);
      process.once('SIGINT', resolve);
    });
    await running.close();
    await db.destroy();
    return 0;
  });
}
