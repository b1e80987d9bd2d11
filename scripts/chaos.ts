/**
 * `npm run chaos -- --minutes 10 --seed 7 [--rate 1] [--work-ms 200] [--settle 180] [--broker-every 60]`
 *
 * The chaos soak: two relays, two of every agent and two observer consumer groups run the
 * demo workflow while new tasks arrive; at random (from the seed) it SIGKILLs agents, relays
 * and consumers, freezes each kind (SIGSTOP) past its lease or Kafka session, restarts the
 * broker, ends Postgres sessions, re-sends published messages and lets stale writers race.
 * After a settle phase an independent checker reads Postgres, the topics and the effect
 * sink. Prints the faults and the checks; the last line is
 * `{"chaos":true,"faults":…,"violations":…,"tasks":…,"by_kind":{…}}`; exit 1 on any violation.
 */
import { parseArgs } from 'node:util';
import { resolveStack } from '../cli/stack/resolve.js';
import { runSoak } from './chaos/soak.js';

const { values } = parseArgs({
  options: {
    minutes: { type: 'string', default: '10' },
    seed: { type: 'string', default: '7' },
    rate: { type: 'string', default: '1' },
    'work-ms': { type: 'string', default: '200' },
    settle: { type: 'string', default: '180' },
    'fault-every-ms': { type: 'string', default: '1500' },
    'broker-every': { type: 'string', default: '60' },
    database: { type: 'string', default: 'cairn_chaos' },
  },
});
const num = (name: keyof typeof values, min: number) => {
  const v = Number(values[name]);
  if (!(v >= min)) {
    console.error(`chaos: --${name} must be a number >= ${min} (got ${values[name]})`);
    process.exit(2);
  }
  return v;
};
const minutes = num('minutes', 0.1);
const log = (line: string) => process.stderr.write(`${line}\n`);
const stack = await resolveStack((l) => log(`[stack] ${l}`));
const database = values.database!;
if (!/^[a-z_][a-z0-9_]{0,62}$/.test(database)) {
  console.error(`chaos: --database must be a plain lower-case name (got ${database})`);
  process.exit(2);
}
const r = await runSoak({
  minutes,
  seed: num('seed', 0),
  rate: num('rate', 0.01),
  workMs: num('work-ms', 0),
  settleS: num('settle', 1),
  faultEveryMs: num('fault-every-ms', 100),
  brokerRestartEveryS: num('broker-every', 1),
  databaseUrl: stack.databaseUrl,
  database,
  kafkaBrokers: stack.kafkaBrokers,
  canRestartBroker: stack.source.kafka.startsWith('local'),
  log,
});
await stack.stop();
console.log('');
console.log('faults injected:');
for (const [k, n] of Object.entries(r.faults)) console.log(`  ${k.padEnd(20)} ${n}`);
console.log(
  `  (${r.injected.duplicates} messages re-sent, ${r.injected.sessionsTerminated} sessions ended, ${r.injected.staleRefused} stale writes refused)`,
);
console.log(
  `processes that exited by themselves: ${r.unexpectedExits}; Kafka consumers replaced after a crash: ${r.consumersReplaced}`,
);
console.log('');
console.log(`${'check'.padEnd(58)} ${'expected'.padEnd(20)} ${'actual'.padEnd(22)} result`);
for (const c of r.checks) {
  console.log(
    `${c.name.slice(-58).padEnd(58)} ${c.expected.padEnd(20)} ${c.actual.padEnd(22)} ${c.violations === 0 ? 'ok' : `VIOLATION x${c.violations}`}`,
  );
}
const faults = Object.values(r.faults).reduce((a, b) => a + b, 0);
console.log(
  JSON.stringify({
    chaos: true,
    faults,
    violations: r.violations,
    tasks: r.tasks,
    terminal: r.terminal,
    unexpected_exits: r.unexpectedExits,
    consumers_replaced: r.consumersReplaced,
    by_kind: r.faults,
    seconds: r.seconds,
    seed: Number(values.seed),
    minutes,
  }),
);
process.exit(r.violations === 0 ? 0 : 1);
