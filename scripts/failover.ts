/**
 * `npm run failover -- [--mode sync|async] [--kafka shared|per-region] [--tasks 20] [--work-ms 200] [--timeout 120]`
 *
 * Regional failover with real processes: region A (a throw-away Postgres primary, a relay,
 * four agents) is killed mid-workflow; region B (a streaming standby) is promoted, checked
 * against the broker and the effect sink, started, and every task resumes from its
 * checkpoint. Prints the checks, RTO and what was lost; the last line is JSON; exit 1 on a
 * violation. Needs Debian's PostgreSQL server binaries (or CAIRN_PG_BIN) and a broker.
 */
import { z } from 'zod';
import { numberFlag, parseScriptArgs } from '../cli/parseScriptArgs.js';
import { resolveStack } from '../cli/stack/resolve.js';
import { verdict } from './demo/verify.js';
import { runFailover } from './failover/scenario.js';

const args = parseScriptArgs({
  name: 'failover',
  usage: `usage: npm run failover -- [flags]

Regional failover with real processes: region A is killed mid-workflow, region B's standby
is promoted, checked against the broker and the effect sink, and every task resumes from its
checkpoint. Needs PostgreSQL's server binaries (or CAIRN_PG_BIN) and a broker. The last line
is JSON; exit 1 on a violation.

flags:
  --mode sync|async     the standby's replication (sync)
  --kafka shared|per-region
                        one broker for both regions (shared), or region B on its own
                        broker (127.0.0.1:19892, CAIRN_FAILOVER_B_PORT) fed from region A's
                        by MirrorMaker 2, paused shortly before the kill (per-region)
  --tasks N             tasks in flight when region A dies (20)
  --work-ms M           simulated agent work per step, in ms (200)
  --timeout S           give up after S seconds (120)
  --changelog-gap       async: region A drops one changelog record of a witness task after
                        the cut; region B's replay must find the gap and hold that task
  --help                this text`,
  options: {
    mode: { type: 'string', default: 'sync' },
    kafka: { type: 'string', default: 'shared' },
    tasks: { type: 'string', default: '20' },
    'work-ms': { type: 'string', default: '200' },
    timeout: { type: 'string', default: '120' },
    'changelog-gap': { type: 'boolean', default: false },
  },
  schema: z.strictObject({
    mode: z.enum(['sync', 'async']),
    kafka: z.enum(['shared', 'per-region']),
    tasks: numberFlag({ above: 0 }, { integer: true }),
    'work-ms': numberFlag({ atLeast: 0 }),
    timeout: numberFlag({ above: 0 }),
    'changelog-gap': z.boolean(),
  }),
});
const log = (line: string) => process.stderr.write(`${line}\n`);
const stack = await resolveStack((l) => log(`[stack] ${l}`));
const r = await runFailover({
  mode: args.mode,
  tasks: args.tasks,
  workMs: args['work-ms'],
  kafkaBrokers: stack.kafkaBrokers,
  kafka: args.kafka,
  timeoutS: args.timeout,
  changelogGap: args['changelog-gap'],
  log,
});
await stack.stop();
console.log('');
console.log(`${'check'.padEnd(48)} ${'expected'.padEnd(16)} ${'actual'.padEnd(22)} result`);
for (const c of r.checks) {
  console.log(`${c.name.padEnd(48)} ${c.expected.padEnd(16)} ${c.actual.padEnd(22)} ${verdict(c)}`);
}
console.log('');
console.log(`RTO (kill of region A -> first transition in region B): ${r.rtoMs} ms`);
console.log(
  `  promote ${r.promoteMs} ms, check ${r.checkMs} ms (changelog replay ${r.changelog.replayMs} ms of it), resume of ${r.resumed} tasks ${r.resumeMs} ms`,
);
console.log(
  `changelog replay: ${r.changelog.rebuilt.length} tasks rebuilt (${r.changelog.rebuilt.join(', ') || 'none'}), ` +
    `${r.changelog.incomplete.length} incomplete (${r.changelog.incomplete.join(', ') || 'none'}), ${r.changelog.refused} records refused`,
);
console.log(
  `lost in region B: ${r.report.lostTransitions.length} transitions, ${r.report.lostConsumptions.length} consumptions, ` +
    `${r.report.missingReceipts.length} receipts, ${r.report.unmirroredMessages.length} messages not mirrored` +
    `${r.unmirrored === null ? '' : ` (${r.unmirrored} on A's broker only)`}; witness ${r.witness.lost}/${r.witness.acked} (${r.witness.lostAfterReplay} after the replay); held: ${r.held.join(', ') || 'none'}`,
);
console.log(
  JSON.stringify({
    failover: true,
    mode: r.mode,
    kafka: args.kafka,
    tasks: r.tasks,
    rto_ms: r.rtoMs,
    promote_ms: r.promoteMs,
    lost_transitions: r.report.lostTransitions.length,
    lost_consumptions: r.report.lostConsumptions.length,
    missing_receipts: r.report.missingReceipts.length,
    unmirrored_detected: r.report.unmirroredMessages.length,
    unmirrored_on_a: r.unmirrored,
    rebuilt_tasks: r.changelog.rebuilt.length,
    incomplete_tasks: r.changelog.incomplete.length,
    refused_records: r.changelog.refused,
    replay_ms: r.changelog.replayMs,
    diverged_tasks: r.report.divergedTasks.length,
    held_tasks: r.held.length,
    witness_lost: r.witness.lost,
    witness_lost_after_replay: r.witness.lostAfterReplay,
    tasks_behind: r.truth.tasksBehind.length,
    violations: r.violations,
  }),
);
process.exit(r.violations === 0 ? 0 : 1);
