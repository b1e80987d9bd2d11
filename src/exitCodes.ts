import { CairnError } from './errors.js';

/**
 * How Cairn's processes (`cairn`, `cairn relay`, the inbox consumer processes) exit. An
 * outage at start is not among them: a process waits for Postgres and the broker instead.
 */
export const ExitCode = {
  /** Done, or stopped by SIGTERM/SIGINT. */
  ok: 0,
  /** Anything unexpected; the message says what. */
  failed: 1,
  /** Unknown command or bad arguments (a CairnError with code 'usage'): nothing was opened or written. */
  usage: 2,
  /** A dependency (a key, a key provider) is unavailable now: nothing was concluded or written; run it again (sysexits EX_TEMPFAIL). */
  unavailable: 75,
  /** A ConfigurationError: a malformed DATABASE_URL or KAFKA_BROKERS, credentials refused, no such database; or a topic that does not exist (sysexits EX_CONFIG). */
  configuration: 78,
} as const;

export function exitCodeFor(err: unknown): number {
  if (!(err instanceof CairnError)) return ExitCode.failed;
  if (err.code === 'configuration' || err.code === 'topic_missing') return ExitCode.configuration;
  if (err.code === 'usage') return ExitCode.usage;
  // An outage concluded nothing: a script must be able to tell it from a finding (exit 1).
  if (err.code === 'unavailable') return ExitCode.unavailable;
  return ExitCode.failed;
}
