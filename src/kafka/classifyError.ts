import { UnavailableError } from '../errors.js';

/**
 * Broker answers that mean "this message will never be accepted as it is": retrying is
 * pointless, so the relay parks the message's key. Everything else (broker down, no leader,
 * timeouts, kafkajs giving up after its own retries) is transient and retried.
 */
const POISON_TYPES = new Set([
  'MESSAGE_TOO_LARGE',
  'RECORD_LIST_TOO_LARGE',
  'INVALID_RECORD',
  'CORRUPT_MESSAGE',
  'INVALID_TOPIC_EXCEPTION',
  'TOPIC_AUTHORIZATION_FAILED',
  'POLICY_VIOLATION',
  'INVALID_REQUIRED_ACKS',
]);

export function isPoisonError(err: unknown): boolean {
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e && typeof e === 'object' && !seen.has(e)) {
    seen.add(e);
    const type = (e as { type?: unknown }).type;
    if (typeof type === 'string' && POISON_TYPES.has(type)) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * Errors at connect that waiting cannot fix: the broker refused our credentials, or an
 * address is not one a socket can use. A refused or timed-out connection is an outage.
 */
export function isKafkaConfigurationError(err: unknown): boolean {
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e && typeof e === 'object' && !seen.has(e)) {
    seen.add(e);
    const { name, code } = e as { name?: unknown; code?: unknown };
    if (name === 'KafkaJSSASLAuthenticationError' || code === 'ERR_SOCKET_BAD_PORT') return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * Connects a kafkajs client (an admin, say) for a one-shot job: a broker that does not answer
 * is an outage (UnavailableError, exit 75), never an answer; a setting that can never work
 * (isKafkaConfigurationError) is thrown as it is.
 */
export async function connectOrUnavailable(client: { connect(): Promise<void> }, job: string): Promise<void> {
  try {
    await client.connect();
  } catch (err) {
    if (isKafkaConfigurationError(err)) throw err;
    throw new UnavailableError(`the broker did not answer ${job}: ${(err as Error).message}`, err);
  }
}
