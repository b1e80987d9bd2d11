import { sql } from 'kysely';
import { z } from 'zod';
import type { Db } from '../src/db/database.js';
import { CairnError, NotFoundError, UnavailableError, ValidationError } from '../src/errors.js';
import { connectOrUnavailable } from '../src/kafka/classifyError.js';
import type { Publisher } from '../src/kafka/publisher.js';
import { parseOptions } from '../src/options.js';
import { HEADER } from '../src/outbox/wire.js';

/**
 * Kafka allows nearly any group id and Cairn keeps foreign message ids as given, so this only
 * refuses what cannot be one pasted from `cairn inbox dlq`: empty, control characters, or
 * surrounding spaces.
 */
const printedId = (max: number, what: string) =>
  z.string().refine((s) => s.length <= max && s.trim() === s && /^[^\p{Cc}]+$/u.test(s), {
    message: `must be ${what} as \`cairn inbox dlq\` prints it: 1-${max} characters, no control characters or surrounding spaces`,
  });
export const ConsumerGroupId = printedId(255, 'a consumer group id');
/** The `cairn-message-id` header, or `<topic>:<partition>:<offset>` for a message without one. */
export const InboxMessageId = printedId(512, 'a message id');

const ReplayInput = z.strictObject({
  messageId: InboxMessageId,
  groupId: ConsumerGroupId,
  tenantId: z.string().optional(),
});

/**
 * A message the inbox consumer gave up on: where it came from, the last error, its
 * attempts, and whether it was replayed.
 */
export interface DeadLetter {
  consumer_group: string;
  /** The tenant whose message it is (null: none); message ids are unique per tenant. */
  tenant_id: string | null;
  message_id: string;
  topic: string;
  partition: number;
  offset: number;
  error: string;
  attempts: number;
  dead_at: Date;
  replayed_at: Date | null;
}

/** The dead letters recorded for a consumer group (or every group), newest first. */
export async function listDeadLetters(db: Db, groupId?: string): Promise<DeadLetter[]> {
  if (groupId !== undefined)
    parseOptions('dead letter filter', z.object({ groupId: ConsumerGroupId }), { groupId });
  let q = db
    .selectFrom('inbox_dlq')
    .select([
      'consumer_group',
      'tenant_id',
      'message_id',
      'topic',
      'partition',
      'offset',
      'error',
      'attempts',
      'dead_at',
      'replayed_at',
    ])
    .orderBy('id');
  if (groupId) q = q.where('consumer_group', '=', groupId);
  return q.execute();
}

/**
 * Sends a dead letter back to its original topic with its original headers (same message
 * id). The group's dead-lettered inbox row is removed, so the consumer applies it as new. Safe
 * to run again: while the replayed copy is unconsumed it is simply sent again (the inbox drops
 * the second copy); once the group applied it, the replay is refused and nothing is sent — an
 * applied message never becomes un-applied. The message is sent before the transaction that
 * marks the letter replayed commits (a consumer that gets it first waits on that transaction's
 * lock on the inbox row), so a broker that is down leaves the letter as it was, not replayed.
 */
export async function replayDeadLetter(
  db: Db,
  publisher: Publisher,
  input: { messageId: string; groupId: string; tenantId?: string },
): Promise<DeadLetter> {
  const a = parseOptions('dead letter replay', ReplayInput, input);
  // Connected before any row is locked: a broker that does not answer holds no lock (and is an
  // outage, exit 75 for `cairn inbox replay`, not a failure).
  await connectOrUnavailable(publisher, 'the dead-letter replay');
  try {
    return await replayLocked(db, publisher, a);
  } finally {
    // A frozen broker can hold a disconnect for many seconds: the rows are already released,
    // so the operator is not kept waiting on it.
    await Promise.race([
      publisher.disconnect().catch(() => {}),
      new Promise((r) => setTimeout(r, 2_000).unref()),
    ]);
  }
}

async function replayLocked(
  db: Db,
  publisher: Publisher,
  a: { messageId: string; groupId: string; tenantId?: string | undefined },
): Promise<DeadLetter> {
  return db.transaction().execute(async (trx) => {
    // A process that dies or hangs mid-replay must not keep these rows locked for hours (a
    // consumer that got the copy waits on the inbox row): Postgres ends such a session.
    await sql`SET LOCAL idle_in_transaction_session_timeout = '15s'`.execute(trx);
    let q = trx
      .selectFrom('inbox_dlq')
      .selectAll()
      .where('consumer_group', '=', a.groupId)
      .where('message_id', '=', a.messageId)
      .forUpdate();
    if (a.tenantId !== undefined) q = q.where(sql<boolean>`coalesce(tenant_id, '') = ${a.tenantId}`);
    const found = await q.execute();
    if (found.length === 0) throw new NotFoundError(`dead letter of group ${a.groupId}`, a.messageId);
    if (found.length > 1) {
      throw new ValidationError('replay', [
        {
          path: 'tenant',
          message: `message ${a.messageId} is a dead letter of tenants ${found.map((f) => f.tenant_id ?? '(none)').join(', ')}: name one`,
        },
      ]);
    }
    const dl = found[0]!;
    // Dead-lettered with no tenant because its own could not be stored (deadLetterIdentity): a
    // copy would be applied as the tenant its header names, or with none. It is no tenant's.
    const named = dl.tenant_id === null ? dl.headers[HEADER.tenant] : undefined;
    if (named) {
      throw new ValidationError('replay', [
        {
          path: HEADER.tenant,
          message: `message ${a.messageId} names a tenant the inbox cannot store (a NUL byte, or over 256 bytes): it is no tenant's, and is not replayed; nothing was sent`,
          value: named.slice(0, 200),
        },
      ]);
    }
    // A key kept with U+FFFD for what it held (a NUL byte, which Postgres does not store; bytes
    // that are not UTF-8, which the client decoded so) is not the key the message came with: a
    // copy under it would go to another partition, after the messages of its own key.
    if (dl.key?.includes('\uFFFD')) {
      throw new ValidationError('replay', [
        {
          path: 'key',
          message: `message ${a.messageId}'s key holds U+FFFD, which is how a key that was not stored as it came is kept (a NUL byte, bytes that are not UTF-8): a copy may go under another key, to another partition; it is not replayed, nothing was sent (send it again from its producer)`,
          value: dl.key.slice(0, 200),
        },
      ]);
    }
    const tenant = sql<boolean>`coalesce(tenant_id, '') = ${dl.tenant_id ?? ''}`;
    const inbox = await trx
      .selectFrom('inbox')
      .select('outcome')
      .where('consumer_group', '=', a.groupId)
      .where(tenant)
      .where('message_id', '=', a.messageId)
      .forUpdate()
      .executeTakeFirst();
    if (inbox?.outcome === 'applied') {
      throw new CairnError(
        'already_applied',
        `message ${a.messageId} was already applied by group ${a.groupId} (an earlier replay went through); nothing was sent`,
      );
    }
    await trx
      .deleteFrom('inbox')
      .where('consumer_group', '=', a.groupId)
      .where(tenant)
      .where('message_id', '=', a.messageId)
      .where('outcome', '=', 'dead_lettered')
      .execute();
    await trx.updateTable('inbox_dlq').set({ replayed_at: new Date() }).where('id', '=', dl.id).execute();
    await withinDeadline(
      publisher.publish([
        {
          topic: dl.topic,
          key: dl.key ?? dl.message_id,
          value: dl.payload ?? Buffer.alloc(0),
          // Cairn's own headers as the row's columns say, whatever the stored copy holds.
          headers: {
            ...dl.headers,
            [HEADER.messageId]: dl.message_id,
            ...(dl.tenant_id ? { [HEADER.tenant]: dl.tenant_id } : {}),
          },
        },
      ]),
    );
    return dl;
  });
}

/**
 * How long a replay waits for the broker's ack while it holds the letter's rows: well under a
 * consumer's session (10 s), which may be waiting on the inbox row for the copy already sent.
 */
const REPLAY_PUBLISH_DEADLINE_MS = 5_000;

/**
 * The publish, or an UnavailableError after the deadline: the transaction rolls back, the
 * letter stays unreplayed (a copy the broker took anyway is dropped by the inbox as the
 * dead-lettered row it still is), and the replay can be run again.
 */
async function withinDeadline(publish: Promise<void>): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new UnavailableError(
            `the broker did not acknowledge the replayed message within ${REPLAY_PUBLISH_DEADLINE_MS / 1000} s; nothing was marked replayed: replay it again`,
          ),
        ),
      REPLAY_PUBLISH_DEADLINE_MS,
    );
  });
  publish.catch(() => {}); // settled after the deadline: already reported
  try {
    await Promise.race([publish, late]);
  } finally {
    clearTimeout(timer);
  }
}
