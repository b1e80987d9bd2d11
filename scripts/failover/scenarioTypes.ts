import type { FailoverReport } from '../../src/recovery/failover.js';
import type { Check } from '../demo/verify.js';

/** What runFailover (scenario.ts) takes and what it reports. */
export interface FailoverOptions {
  mode: 'sync' | 'async';
  tasks: number;
  workMs: number;
  kafkaBrokers: string;
  /** shared: both regions use `kafkaBrokers`; per-region: B has its own, mirrored (perRegion.ts). */
  kafka?: 'shared' | 'per-region';
  timeoutS: number;
  log: (line: string) => void;
  /** async: region A drops one changelog record of a witness task after the cut (changelogReplay.ts). */
  changelogGap?: boolean;
  /**
   * Called after the check, before region B starts: the promoted database's URL, the topics and
   * groups as checked (mirrored names with per-region), and the brokers region B reads.
   */
  afterCheck?: (
    databaseUrl: string,
    topics: string[],
    groups: Array<{ groupId: string; topics: string[] }>,
    brokers: string,
  ) => Promise<void>;
}

export interface FailoverResult {
  mode: 'sync' | 'async';
  tasks: number;
  /** Open tasks region B could resume (neither terminal nor held) after the check. */
  resumable: number;
  /** Kill of region A to the first transition an agent committed in region B; null when nothing was resumable. */
  rtoMs: number | null;
  promoteMs: number;
  /** Promotion to the end of the check, the changelog replay included. */
  checkMs: number;
  resumeMs: number;
  report: FailoverReport;
  /** The changelog replay into region B, before the check: what it rebuilt, what it could not, how long it took. */
  changelog: { rebuilt: string[]; incomplete: string[]; refused: number; replayMs: number };
  /** Tasks quarantined in region B: the check's diverged tasks and the replay's incomplete ones. */
  held: string[];
  /** Witness writes acknowledged by region A, and how many of them region B lacks. */
  witness: { acked: number; lost: number; lostAfterReplay: number };
  /** From region A's own data folder, restarted after the test: tasks whose version B lacked. */
  truth: { tasksBehind: string[]; falselyFlagged: string[]; digestMismatched: string[] };
  resumed: number;
  /** per-region: messages region A's broker has that the mirror lacked at the failover. */
  unmirrored: number | null;
  checks: Check[];
  violations: number;
}
