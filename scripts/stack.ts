/**
 * `npm run stack:up | stack:down | stack:status`: the local Postgres + Kafka that tests, the
 * demo and the benchmarks use when DATABASE_URL / KAFKA_BROKERS are not set.
 */
import { down, status, up } from './stack/commands.js';

const command = process.argv[2];
try {
  if (command === 'up') await up();
  else if (command === 'down') await down();
  else if (command === 'status') process.exitCode = await status();
  else {
    console.error('usage: tsx scripts/stack.ts up|down|status');
    process.exitCode = 2;
  }
} catch (err) {
  console.error(`[cairn stack] ${(err as Error).message}`);
  process.exitCode = 1;
}
