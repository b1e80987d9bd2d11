import { isDatabaseOutage } from './db/sqlstate.js';
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

/**
 * Codes of Cairn's errors that say a dependency is not there now (the key provider's file
 * unreadable, a data key that does not unwrap under its keyring): nothing was concluded, as
 * for `unavailable`.
 */
const UNAVAILABLE_CODES = new Set(['unavailable', 'keyring_unreadable', 'key_unavailable']);

export function exitCodeFor(err: unknown): number {
  // Postgres went away (a session terminated, refused, too many connections), stalled past a
  // statement timeout or takes no writes yet: an outage, never a finding, whatever the command.
  if (!(err instanceof CairnError)) return isDatabaseOutage(err) ? ExitCode.unavailable : ExitCode.failed;
  if (err.code === 'configuration' || err.code === 'topic_missing') return ExitCode.configuration;
  if (err.code === 'usage') return ExitCode.usage;
  // An outage concluded nothing: a script must be able to tell it from a finding (exit 1).
  if (UNAVAILABLE_CODES.has(err.code)) return ExitCode.unavailable;
  return ExitCode.failed;
}
