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

/**
 * The same answers as Kafka protocol error codes, which is how librdkafka
 * (@confluentinc/kafka-javascript) reports them; it also refuses a message over
 * message.max.bytes itself, before sending, with the broker's code (10).
 */
const POISON_CODES = new Set([10, 18, 87, 2, 17, 29, 44, 21]);

/**
 * A librdkafka error: a numeric `code` (a Kafka protocol code, or a negative local one) that
 * its `errno` repeats, and an `origin`. Other errors with a numeric code (kafkajs's protocol
 * errors) are told apart by `type` already.
 */
function librdkafkaCode(e: object): number | undefined {
  const { code, errno, origin } = e as { code?: unknown; errno?: unknown; origin?: unknown };
  return typeof code === 'number' && errno === code && typeof origin === 'string' ? code : undefined;
}

export function isPoisonError(err: unknown): boolean {
  return someInChain(err, (e) => {
    // kafkajs names a broker error `type`; @platformatic/kafka names it `apiId`.
    const { type, apiId } = e as { type?: unknown; apiId?: unknown };
    const code = librdkafkaCode(e);
    return (
      (typeof type === 'string' && POISON_TYPES.has(type)) ||
      (typeof apiId === 'string' && POISON_TYPES.has(apiId)) ||
      (code !== undefined && POISON_CODES.has(code))
    );
  });
}

/**
 * True when `test` holds for the error or anything it wraps: its `cause`, and each of its
 * `errors` (an AggregateError: @platformatic/kafka reports a failed send as one holding each
 * attempt's error, and a broker response as one holding each partition's).
 */
export function someInChain(err: unknown, test: (e: object) => boolean): boolean {
  const seen = new Set<unknown>();
  const todo: unknown[] = [err];
  while (todo.length > 0) {
    const e = todo.pop();
    if (!e || typeof e !== 'object' || seen.has(e)) continue;
    seen.add(e);
    if (test(e)) return true;
    todo.push((e as { cause?: unknown }).cause);
    const inner = (e as { errors?: unknown }).errors;
    if (Array.isArray(inner)) todo.push(...inner);
  }
  return false;
}

/**
 * The broker refused a send for the producer's idempotence state (a sequence number it has used,
 * or an epoch or id it no longer knows): the send says nothing about its messages, and a fresh
 * producer (a new producer id) sends them.
 */
const PRODUCER_STATE_TYPES = new Set([
  'OUT_OF_ORDER_SEQUENCE_NUMBER',
  'DUPLICATE_SEQUENCE_NUMBER',
  'INVALID_PRODUCER_EPOCH',
  'UNKNOWN_PRODUCER_ID',
]);

export function isProducerStateError(err: unknown): boolean {
  return someInChain(err, (e) => {
    const { type, apiId } = e as { type?: unknown; apiId?: unknown };
    return (
      (typeof type === 'string' && PRODUCER_STATE_TYPES.has(type)) ||
      (typeof apiId === 'string' && PRODUCER_STATE_TYPES.has(apiId))
    );
  });
}

/**
 * The broker has no such topic (UNKNOWN_TOPIC_OR_PARTITION; librdkafka's 3, or its local -188;
 * @platformatic/kafka turns the metadata's answer into a UserError "Unknown topic <name>."):
 * one auto-creation cannot make (it collides with another by '.' and '_'), or auto-creation off.
 * Retriable, as a topic being created answers the same for a moment: the relay sends the other
 * topics of the batch on their own, and parks this one's keys only when they go through.
 */
export function isUnknownTopic(err: unknown): boolean {
  return someInChain(err, (e) => {
    const {
      type,
      apiId,
      code: name,
      message,
    } = e as { type?: unknown; apiId?: unknown; code?: unknown; message?: unknown };
    const code = librdkafkaCode(e);
    return (
      type === 'UNKNOWN_TOPIC_OR_PARTITION' ||
      apiId === 'UNKNOWN_TOPIC_OR_PARTITION' ||
      code === 3 ||
      code === -188 ||
      (name === 'PLT_KFK_USER' && typeof message === 'string' && message.startsWith('Unknown topic '))
    );
  });
}

/**
 * Errors at connect that waiting cannot fix: the broker refused our credentials, or an
 * address is not one a socket can use. A refused or timed-out connection is an outage.
 */
export function isKafkaConfigurationError(err: unknown): boolean {
  return someInChain(err, (e) => {
    const { name, code } = e as { name?: unknown; code?: unknown };
    const rdCode = librdkafkaCode(e);
    return (
      name === 'KafkaJSSASLAuthenticationError' ||
      code === 'PLT_KFK_AUTHENTICATION' ||
      code === 'ERR_SOCKET_BAD_PORT' ||
      // librdkafka: authentication failed (local -169, broker 58), a setting it refuses (-186)
      rdCode === -169 ||
      rdCode === 58 ||
      rdCode === -186
    );
  });
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

/**
 * An error that may go away when asked again (a leader election under way, a coordinator
 * loading, a timeout). kafkajs says so in `retriable`; @platformatic/kafka sets `canRetry` on
 * the protocol errors of its chain, and retries only when none says false.
 */
export function isRetriableKafkaError(err: unknown): boolean {
  if ((err as { retriable?: unknown } | null)?.retriable === true) return true;
  return (
    someInChain(err, (e) => {
      const { canRetry, code } = e as { canRetry?: unknown; code?: unknown };
      return canRetry === true || code === 'PLT_KFK_NETWORK' || code === 'PLT_KFK_TIMEOUT';
    }) && !someInChain(err, (e) => (e as { canRetry?: unknown }).canRetry === false)
  );
}

/**
 * A request the broker refused for good (an invalid replication factor, a policy, an ACL):
 * kafkajs marks each error of it not retriable; @platformatic/kafka marks one `canRetry: false`.
 */
export function isRefusedKafkaError(err: unknown): boolean {
  const errors = (err as { errors?: unknown[] } | null)?.errors ?? [err];
  const kafkajs =
    errors.length > 0 && errors.every((e) => (e as { retriable?: unknown } | null)?.retriable === false);
  return kafkajs || someInChain(err, (e) => (e as { canRetry?: unknown }).canRetry === false);
}

/** Socket errors (Node's `code`) of a broker this process cannot reach. */
const UNREACHABLE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
]);
const UNREACHABLE_NAMES = new Set([
  'KafkaJSConnectionError',
  'KafkaJSConnectionClosedError',
  'KafkaJSRequestTimeoutError',
  'KafkaJSBrokerNotFound',
]);
/** librdkafka's local codes: transport (-195), all brokers down (-187), timed out (-185), a message timed out (-192). */
const UNREACHABLE_RD_CODES = new Set([-195, -187, -185, -192]);

/**
 * A send failed because this process could not reach the broker (refused, reset or timed-out
 * connections), not because of what it sent: a broker answer about a topic or a message (a
 * partition without a leader, a topic that does not exist) is not one. The relay gives its
 * lanes to others only for this (relay/stepAside.ts): another relay may reach the broker, while
 * a message's failure would follow its lane to any relay.
 */
export function isBrokerUnreachable(err: unknown): boolean {
  return someInChain(err, (e) => {
    const { name, code } = e as { name?: unknown; code?: unknown };
    const rdCode = librdkafkaCode(e);
    return (
      (typeof name === 'string' && UNREACHABLE_NAMES.has(name)) ||
      (typeof code === 'string' &&
        (UNREACHABLE_CODES.has(code) || code === 'PLT_KFK_NETWORK' || code === 'PLT_KFK_TIMEOUT')) ||
      (rdCode !== undefined && UNREACHABLE_RD_CODES.has(rdCode))
    );
  });
}
