/**
 * `npm run chaos -- --minutes 10 --seed 7 [--rate 1] [--work-ms 200] [--settle 180] [--broker-every 60] [--brokers 3]`
 *
 * The chaos soak: two relays, two of every agent and two observer consumer groups run the
 * demo workflow while new tasks arrive; at random (from the seed) it SIGKILLs agents, relays
 * and consumers, freezes each kind (SIGSTOP) past its lease or Kafka session, restarts the
 * broker, ends Postgres sessions, re-sends published messages and lets stale writers race.
 * After a settle phase an independent checker reads Postgres, the topics and the effect
 * sink. Prints the faults and the checks; the last line is
 * `{"chaos":true,"faults":…,"violations":…,"not_checked":…,"tasks":…,"by_kind":{…}}`; exit 1 on any
 * violation or any check that could not run.
 */
import { z } from 'zod';
import { databaseFlag, numberFlag, parseScriptArgs } from '../cli/parseScriptArgs.js';
import { resolveStack } from '../cli/stack/resolve.js';
import { runSoak } from './chaos/soak.js';
import { verdict } from './demo/verify.js';

const args = parseScriptArgs({
  name: 'chaos',
  usage: `usage: npm run chaos -- [flags]

The chaos soak: relays, agents and observers run the demo workflow under seeded faults
(kills, freezes, broker restarts, session kills, duplicates, stale writers), then an
independent checker reads Postgres, the topics and the effect sink. The last line is JSON;
exit 1 on any violation.

flags:
  --minutes M           how long faults are injected (10)
  --seed S              fixes which faults happen in which order (7)
  --rate R              new tasks per second (1)
  --work-ms M           simulated agent work per step, in ms (200)
  --settle S            seconds, after the faults stop, for every task to settle (180)
  --fault-every-ms M    one fault every M ms (1500)
  --broker-every S      at most one broker restart every S seconds (60)
  --brokers N           N > 1: a local KRaft cluster of N nodes (replication 3, min ISR 2);
                        the broker fault then SIGKILLs one node and starts it again (1)
  --database NAME       the scratch database, dropped and created again (cairn_chaos)
  --help                this text`,
  options: {
    minutes: { type: 'string', default: '10' },
    seed: { type: 'string', default: '7' },
    rate: { type: 'string', default: '1' },
    'work-ms': { type: 'string', default: '200' },
    settle: { type: 'string', default: '180' },
    'fault-every-ms': { type: 'string', default: '1500' },
    'broker-every': { type: 'string', default: '60' },
    brokers: { type: 'string', default: '1' },
    database: { type: 'string', default: 'cairn_chaos' },
  },
  schema: z.strictObject({
    minutes: numberFlag({ atLeast: 0.1 }),
    seed: numberFlag({ atLeast: 0 }),
    rate: numberFlag({ atLeast: 0.01 }),
    'work-ms': numberFlag({ atLeast: 0 }),
    settle: numberFlag({ atLeast: 1 }),
    'fault-every-ms': numberFlag({ atLeast: 100 }),
    'broker-every': numberFlag({ atLeast: 1 }),
    brokers: numberFlag({ atLeast: 1 }, { integer: true }),
    database: databaseFlag,
  }),
});
const log = (line: string) => process.stderr.write(`${line}\n`);
// --brokers 3: the local stack's three-node cluster; a broker fault SIGKILLs one node.
if (args.brokers > 1) process.env.CAIRN_KAFKA_BROKERS_LOCAL = String(args.brokers);
const stack = await resolveStack((l) => log(`[stack] ${l}`));
const clusterSize = stack.source.kafka.startsWith('local KRaft cluster') ? args.brokers : undefined;
const r = await runSoak({
  minutes: args.minutes,
  seed: args.seed,
  rate: args.rate,
  workMs: args['work-ms'],
  settleS: args.settle,
  faultEveryMs: args['fault-every-ms'],
  brokerRestartEveryS: args['broker-every'],
  databaseUrl: stack.databaseUrl,
  database: args.database,
  kafkaBrokers: stack.kafkaBrokers,
  canRestartBroker: stack.source.kafka.startsWith('local'),
  ...(clusterSize ? { clusterSize } : {}),
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
    `${c.name.slice(-58).padEnd(58)} ${c.expected.padEnd(20)} ${c.actual.padEnd(22)} ${verdict(c)}`,
  );
}
const faults = Object.values(r.faults).reduce((a, b) => a + b, 0);
console.log(
  JSON.stringify({
    chaos: true,
    faults,
    violations: r.violations,
    not_checked: r.notChecked,
    tasks: r.tasks,
    terminal: r.terminal,
    unexpected_exits: r.unexpectedExits,
    consumers_replaced: r.consumersReplaced,
    by_kind: r.faults,
    seconds: r.seconds,
    seed: args.seed,
    minutes: args.minutes,
    brokers: args.brokers,
  }),
);
// A check that could not run proves nothing: the soak passes only when every check ran and held.
process.exit(r.violations === 0 && r.notChecked === 0 ? 0 : 1);
