import { OutcomeUnknownError } from '../errors.js';

/**
 * Socket errors that mean the request may have reached the other side before the connection
 * broke or the wait ended. A refused connection (ECONNREFUSED) or a name that does not resolve
 * never sent anything: those are failures, safe to try again.
 */
const CUT_OFF = new Set([
  'ECONNRESET',
  'ETIMEDOUT',
  'ECONNABORTED',
  'EPIPE',
  'ESOCKETTIMEDOUT',
  'UND_ERR_SOCKET',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
]);

/**
 * Whether an effect's error leaves its outcome unknown: an OutcomeUnknownError, a call cut off
 * (one of CUT_OFF, "socket hang up"), or a wait that ended (AbortError, TimeoutError: fetch with
 * an AbortSignal). Looks through `cause` (fetch wraps the socket's error in a TypeError).
 */
export function outcomeUnknown(err: unknown, depth = 0): boolean {
  if (err === null || typeof err !== 'object' || depth > 4) return false;
  if (err instanceof OutcomeUnknownError) return true;
  const e = err as { code?: unknown; name?: unknown; message?: unknown; cause?: unknown };
  if (typeof e.code === 'string' && CUT_OFF.has(e.code)) return true;
  if (e.name === 'AbortError' || e.name === 'TimeoutError') return true;
  if (typeof e.message === 'string' && /socket hang up/i.test(e.message)) return true;
  return outcomeUnknown(e.cause, depth + 1);
}
