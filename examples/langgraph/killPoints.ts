/**
 * Named places where the example kills itself (SIGKILL, no cleanup, no flush), chosen with
 * CAIRN_EXAMPLE_KILL_AT: the crash test runs the example once per point and then resumes it.
 */
export const AGENTS = ['planner', 'coder', 'reviewer', 'tester', 'deploy'] as const;
export type Agent = (typeof AGENTS)[number];

export const KILL_POINTS: readonly string[] = [
  // `start`: the step before it is in LangGraph's checkpoint; this node has done nothing yet.
  // `after-commit`: the node's CAS, audit row and outbox message committed; LangGraph has not
  // recorded the node as done, so a resume runs it again.
  ...AGENTS.flatMap((a) => [`${a}:start`, `${a}:after-commit`]),
  // The deploy endpoint applied the effect; its receipt still says `started`.
  'deploy:after-effect',
  // The receipt says `succeeded`; the task is not complete yet.
  'deploy:after-receipt',
];

const chosen = process.env.CAIRN_EXAMPLE_KILL_AT || undefined;

/** Throws unless CAIRN_EXAMPLE_KILL_AT is unset or names a kill point: a typo must not pass as "never reached". */
export function checkKillPoint(): string | undefined {
  if (chosen !== undefined && !KILL_POINTS.includes(chosen)) {
    throw new Error(`CAIRN_EXAMPLE_KILL_AT=${chosen} is no kill point; one of: ${KILL_POINTS.join(', ')}`);
  }
  return chosen;
}

/** Dies here, at once, when CAIRN_EXAMPLE_KILL_AT names this point. */
export function killPoint(name: string): void {
  if (name !== chosen) return;
  process.stderr.write(`[example] SIGKILL at ${name}\n`);
  process.kill(process.pid, 'SIGKILL');
}
