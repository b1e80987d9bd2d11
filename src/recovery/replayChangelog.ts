import { sql } from 'kysely';
import { z } from 'zod';
import { canonicalBytes } from '../canonical.js';
import type { KeyRing } from '../checkpoints/signing.js';
import type { TenantKeys } from '../crypto/tenantKeys.js';
import type { Db } from '../db/database.js';
import type { Trx } from '../db/executor.js';
import type { KafkaAdmin } from '../kafka/admin.js';
import { objectWith, optionsSchema, parseOptions } from '../options.js';
import {
  type ChangelogBody,
  type ChangelogEnvelope,
  CONSUMED_RECORDS_HEADER,
  type ConsumedMessage,
  stateDigest,
} from '../state/changelog.js';
import {
  applyRecord,
  auditedHere,
  deletedByRetention,
  openRecord,
  parseEnvelope,
  refusedByDatabase,
  restoreReceipt,
  Unprovable,
} from './changelogRecords.js';
import { readTopicsToEnd } from './failover.js';

/**
 * Rebuilds, after an asynchronous failover, the transitions the promoted database lost from
 * the changelog topic (src/state/changelog.ts): for each task, the records newer than its
 * version here, verified (signature, chain of state digests, the resulting digest) and applied
 * in order through compare-and-swap, with the inbox rows and receipts they name. A task whose
 * records do not prove every lost version (a gap, a bad digest, an unreadable or refused
 * record, a message of its that never reached the broker) is left as it is and reported, to be
 * held like today.
 */

/** What replayChangelog takes. */
export interface ReplayChangelogOptions {
  /** The changelog topic as this region's cluster names it (a MirrorMaker mirror: `A.cairn.changelog`). */
  topic: string;
  /** Verifies record signatures; with it, an unsigned record is refused. */
  keyRing?: KeyRing;
  /** Opens encrypted records (tenant data keys); without it, an encrypted record makes its task incomplete. */
  keys?: TenantKeys;
  /** Who replays: named in each replayed audit row's reason (its actor stays the transition's). */
  actor: string;
  /**
   * The topics of the records' messages are a mirror's (`<sourcePrefix><topic>`): their
   * presence on the broker is checked there.
   */
  sourcePrefix?: string;
  /** Only this tenant's records (an operator acting for one tenant). */
  tenant?: string;
  /** How long reading a topic to its end may take (default 60 s). */
  deadlineMs?: number;
}

const Options = optionsSchema<ReplayChangelogOptions>()(
  z.strictObject({
    topic: z.string().min(1),
    keyRing: z
      .custom<KeyRing>((v) => typeof v === 'object' && v !== null && 'current' in v && 'keys' in v, {
        message: 'must be a KeyRing ({ current, keys })',
      })
      .optional(),
    keys: objectWith<TenantKeys>('TenantKeys (createTenantKeys())', 'seal', 'open').optional(),
    actor: z.string().min(1),
    sourcePrefix: z.string().min(1).optional(),
    tenant: z.string().min(1).optional(),
    deadlineMs: z.number().int().positive().optional(),
  }),
);

/** A task whose lost versions were re-applied. */
export interface RebuiltTask {
  taskId: string;
  tenantId: string;
  /** The version this database held (0: the task itself was lost) and the version rebuilt. */
  from: number;
  to: number;
}

/** A task the changelog cannot rebuild: hold it (quarantine) as a failover without replay would. */
export interface IncompleteTask {
  taskId: string;
  tenantId: string;
  from: number;
  reason: string;
}

/** A record refused on its own (not Cairn's, or claiming what its headers contradict). */
export interface RefusedRecord {
  at: string;
  reason: string;
}

/** What replayChangelog did: tasks rebuilt, tasks it could not prove, records refused. */
export interface ReplayReport {
  rebuilt: RebuiltTask[];
  incomplete: IncompleteTask[];
  refused: RefusedRecord[];
  /** Tasks whose every record this database already holds. */
  upToDate: number;
  restoredInboxRows: number;
  /**
   * Consumed messages whose inbox row was not restored: not every record of their handler was
   * rebuilt, or the message is not on the broker as the tenant's. The check then sees them.
   */
  inboxRowsNotRestored: number;
  restoredReceipts: number;
}

interface Found {
  envelope: ChangelogEnvelope;
  at: string;
  /** CONSUMED_RECORDS_HEADER: how many records the consuming handler wrote. */
  consumedRecords: number | null;
}

/**
 * Reads the changelog topic to its end and rebuilds, task by task, the versions `db` lacks
 * (see the module comment); run on a promoted database before `checkAfterFailover`, then hold
 * `incomplete` tasks. Running it again changes nothing already rebuilt.
 */
export async function replayChangelog(
  db: Db,
  kafka: KafkaAdmin,
  options: ReplayChangelogOptions,
): Promise<ReplayReport> {
  const o = parseOptions('changelog replay options', Options, options);
  const report: ReplayReport = {
    rebuilt: [],
    incomplete: [],
    refused: [],
    upToDate: 0,
    restoredInboxRows: 0,
    inboxRowsNotRestored: 0,
    restoredReceipts: 0,
  };
  const byTask = new Map<string, Map<number, Found[]>>();
  for (const m of await readTopicsToEnd(kafka, [o.topic], o.deadlineMs, { values: true })) {
    const at = `${m.topic}/${m.partition}/${m.offset}`;
    const envelope = parseEnvelope(m.value ?? null);
    if (!envelope) {
      report.refused.push({ at, reason: 'not a changelog record' });
      continue;
    }
    // The relay sets these headers from the outbox row's columns, which row-level security
    // and triggers keep honest: a record claiming another tenant or task than its row's is a lie.
    if (m.tenant !== envelope.tenant_id || m.taskId !== envelope.task_id || m.version !== envelope.version) {
      report.refused.push({
        at,
        reason: `record of ${envelope.tenant_id}/${envelope.task_id} v${envelope.version} came from an outbox row of ${m.tenant}/${m.taskId} v${m.version}`,
      });
      continue;
    }
    if (o.tenant !== undefined && envelope.tenant_id !== o.tenant) continue;
    const id = `${envelope.tenant_id}\u0000${envelope.task_id}`;
    const versions = byTask.get(id) ?? new Map<number, Found[]>();
    byTask.set(id, versions);
    const same = versions.get(envelope.version) ?? [];
    // A record sent twice (a relay retry, a mirror) is one record.
    const bytes = canonicalBytes(envelope).toString();
    const n = Number(m.headers?.[CONSUMED_RECORDS_HEADER]);
    const consumedRecords = Number.isInteger(n) && n > 0 ? n : null;
    if (!same.some((f) => canonicalBytes(f.envelope).toString() === bytes))
      same.push({ envelope, at, consumedRecords });
    versions.set(envelope.version, same);
  }

  const pending: Array<{ task: TaskAt; records: VerifiedRecord[] }> = [];
  const consumed = new Map<
    string,
    { c: ConsumedMessage; tenantId: string; applied: number; expected: number | null }
  >();
  for (const [id, versions] of byTask) {
    const [tenantId, taskId] = id.split('\u0000') as [string, string];
    const row = await db
      .selectFrom('task_state')
      .select(['tenant_id', 'version', 'doc'])
      .where('task_id', '=', taskId)
      .executeTakeFirst();
    if (row && row.tenant_id !== tenantId) {
      report.refused.push({
        at: [...versions.values()][0]![0]!.at,
        reason: `records of tenant ${tenantId} for task ${taskId}, a task of another tenant here`,
      });
      continue;
    }
    if (!row && (await deletedByRetention(db, tenantId, taskId))) {
      // Its records outlive it on the topic (retention.ms): a replay must not bring it back.
      report.refused.push({
        at: [...versions.values()][0]![0]!.at,
        reason: `task ${taskId} of tenant ${tenantId} was deleted by retention here (a deletion certificate names it): not recreated`,
      });
      continue;
    }
    if (!row && (await auditedHere(db, taskId))) {
      // Deleted here (by its tenant, say) but its audit rows stay: recreating it would collide.
      report.refused.push({
        at: [...versions.values()][0]![0]!.at,
        reason: `task ${taskId} has audit rows here but no row: it was deleted, not lost; not recreated`,
      });
      continue;
    }
    const task: TaskAt = { tenantId, taskId, version: row?.version ?? 0, doc: row?.doc ?? null };
    const newer = [...versions.keys()].filter((v) => v > task.version).sort((a, b) => a - b);
    if (newer.length === 0) {
      report.upToDate++;
      continue;
    }
    try {
      const records = [];
      let doc = task.doc;
      for (let v = task.version + 1; v <= newer[newer.length - 1]!; v++) {
        const candidates = versions.get(v);
        if (!candidates)
          throw new Unprovable(`gap: no record of version ${v} (records up to ${newer.at(-1)})`);
        if (candidates.length > 1)
          throw new Unprovable(
            `two different records of version ${v} (${candidates.map((c) => c.at).join(', ')})`,
          );
        const found = candidates[0]!;
        const body = await openRecord(db, found.envelope, o);
        doc = applyRecord(doc, found.envelope, body);
        records.push({ found, body, doc });
      }
      pending.push({ task, records });
    } catch (err) {
      if (!(err instanceof Unprovable)) throw err;
      report.incomplete.push({ taskId, tenantId, from: task.version, reason: err.message });
    }
  }

  // Every message a replayed transition enqueued must be on the broker: one that never left
  // the lost region would leave the rebuilt task waiting for it forever.
  const wanted = new Set(
    pending.flatMap((p) =>
      p.records.flatMap((r) => [
        ...r.body.messages.map((m) => m.topic),
        ...(r.body.consumed ? [r.body.consumed.topic] : []),
      ]),
    ),
  );
  const onBroker = new Map<
    string,
    Array<{ topic: string; partition: number; offset: string; timestamp?: string }>
  >();
  if (wanted.size > 0) {
    const topics = [...wanted].map((t) => `${o.sourcePrefix ?? ''}${t}`);
    const existing = new Set(await kafka.listTopics());
    const seen = await readTopicsToEnd(
      kafka,
      topics.filter((t) => existing.has(t)),
      o.deadlineMs,
    );
    for (const m of seen) {
      const k = `${m.tenant ?? ''}\u0000${m.messageId}`;
      onBroker.set(k, [...(onBroker.get(k) ?? []), m]);
    }
  }
  for (const { task, records } of pending) {
    const missing = records
      .flatMap((r) => r.body.messages)
      .find((m) => !onBroker.has(`${task.tenantId}\u0000${m.id}`));
    if (missing) {
      report.incomplete.push({
        ...pick(task),
        reason: `message ${missing.id} (${missing.topic}) of a lost transition never reached this broker`,
      });
      continue;
    }
    try {
      const restored = await db.transaction().execute((trx) => writeRecords(trx, records, o));
      report.rebuilt.push({ ...pick(task), to: records.at(-1)!.found.envelope.version });
      report.restoredReceipts += restored.receipts;
      for (const { found, body } of records) {
        if (!body.consumed) continue;
        const k = `${task.tenantId}\u0000${body.consumed.consumer_group}\u0000${body.consumed.message_id}`;
        const c = consumed.get(k) ?? {
          c: body.consumed,
          tenantId: task.tenantId,
          applied: 0,
          expected: found.consumedRecords,
        };
        c.applied++;
        consumed.set(k, c);
      }
    } catch (err) {
      const reason = refusedByDatabase(err);
      if (reason === undefined) throw err;
      // Another replay run at the same time wrote these very versions first: the task is up to
      // date, not lost (reporting it would make --hold quarantine a task just rebuilt).
      const last = records.at(-1)!;
      const now = await db
        .selectFrom('task_state')
        .select(['tenant_id', 'version', 'doc'])
        .where('task_id', '=', task.taskId)
        .executeTakeFirst();
      if (
        now?.tenant_id === task.tenantId &&
        Number(now.version) === last.found.envelope.version &&
        stateDigest(now.doc) === stateDigest(last.doc)
      ) {
        report.upToDate++;
        continue;
      }
      report.incomplete.push({ ...pick(task), reason });
    }
  }
  // A consumed message's inbox row only when every record its handler wrote was rebuilt, and the
  // message is on the broker as the tenant's: a handler replayed in part, or a record naming a
  // message that is not there (another tenant's, say), must not mark it applied.
  for (const { c, tenantId, applied, expected } of consumed.values()) {
    const copies = onBroker.get(`${tenantId}\u0000${c.message_id}`) ?? [];
    const proven = copies.some(
      (m) =>
        m.topic === `${o.sourcePrefix ?? ''}${c.topic}` &&
        (o.sourcePrefix !== undefined || (m.partition === c.partition && m.offset === c.offset)),
    );
    if (!proven || expected === null || applied !== expected) {
      report.inboxRowsNotRestored++;
      continue;
    }
    // applied_at: the replay's time, so pruning keeps the row a full retention from now (a
    // message's record time is its producer's to choose: an old one had the row pruned at once
    // and the message applied again). The failover check does not read loss out of it
    // (failoverMirror.ts: only messages older than the inbox retention may have been pruned).
    const r = await sql`
      INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", tenant_id, key)
      VALUES (${c.consumer_group}, ${c.message_id}, ${c.topic}, ${c.partition}, ${c.offset}, ${tenantId}, ${c.key})
      ON CONFLICT DO NOTHING`.execute(db);
    report.restoredInboxRows += Number(r.numAffectedRows ?? 0);
  }
  report.rebuilt.sort((a, b) => a.taskId.localeCompare(b.taskId));
  report.incomplete.sort((a, b) => a.taskId.localeCompare(b.taskId));
  return report;
}

interface TaskAt {
  tenantId: string;
  taskId: string;
  version: number;
  doc: unknown;
}
const pick = (t: TaskAt) => ({ taskId: t.taskId, tenantId: t.tenantId, from: t.version });

/** A record whose chain and digests were checked, with the document it leads to. */
interface VerifiedRecord {
  found: Found;
  body: ChangelogBody;
  doc: unknown;
}

/**
 * Writes a task's verified records in order, with CAS (from the version they were verified
 * against), in one transaction; restores inbox rows and receipts.
 */
async function writeRecords(
  trx: Trx,
  records: readonly VerifiedRecord[],
  o: ReplayChangelogOptions,
): Promise<{ receipts: number }> {
  let receipts = 0;
  for (const { found, body, doc } of records) {
    const e = found.envelope;
    const reason = `replayed from changelog ${found.at} by ${o.actor}${body.reason ? `: ${body.reason}` : ''}`;
    if (e.version === 1) {
      const r = await sql`
        INSERT INTO task_state (task_id, tenant_id, version, schema_version, status, doc)
        VALUES (${e.task_id}, ${e.tenant_id}, 1, ${body.schema_version}, ${body.status}, ${JSON.stringify(doc)}::jsonb)
        ON CONFLICT (task_id) DO NOTHING`.execute(trx);
      if (Number(r.numAffectedRows ?? 0) !== 1) throw new Unprovable('created in this region since');
    } else {
      const r = await sql`
        UPDATE task_state SET version = ${e.version}, status = ${body.status},
               schema_version = ${body.schema_version}, doc = ${JSON.stringify(doc)}::jsonb, updated_at = now()
         WHERE task_id = ${e.task_id} AND version = ${e.version - 1}`.execute(trx);
      if (Number(r.numAffectedRows ?? 0) !== 1) throw new Unprovable('changed in this region since');
    }
    await trx
      .insertInto('task_audit')
      .values({
        task_id: e.task_id,
        version: e.version,
        prev_version: e.prev_version,
        tenant_id: e.tenant_id,
        actor: body.actor,
        reason,
        patch: JSON.stringify(body.patch),
      })
      .execute();
    for (const rc of body.receipts) receipts += await restoreReceipt(trx, e, rc);
  }
  return { receipts };
}
