import type { RunnableConfig } from '@langchain/core/runnables';
import {
  BaseCheckpointSaver,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  maxChannelVersion,
  type PendingWrite,
  type SerializerProtocol,
  TASKS,
  WRITES_IDX_MAP,
} from '@langchain/langgraph-checkpoint';
import { sql } from 'kysely';
import { z } from 'zod';
import type { KeyRing } from '../src/checkpoints/signing.js';
import type { TenantKeys } from '../src/crypto/tenantKeys.js';
import type { Db } from '../src/db/database.js';
import { rethrowMapped } from '../src/db/sqlstate.js';
import { tenantOf } from '../src/db/tenant.js';
import { CairnError, CairnErrorCodes, ConfigurationError, ValidationError } from '../src/errors.js';
import { objectWith, opt, optionsSchema, parseOptions } from '../src/options.js';
import {
  blobDigest,
  checkpointDigest,
  type RowSignature,
  signatureProblem,
  signDigest,
  type ThreadScope,
  type TypedBytes,
  writeDigest,
} from './integrity.js';
import {
  type CheckpointRow,
  insertPut,
  insertWrites,
  lockThread,
  readHead,
  selectCheckpoints,
  selectPendingSends,
  type WriteRow,
} from './sql.js';

/** Decides whether a checkpoint is a semantic boundary (kept by compaction). */
export type BoundaryRule = (metadata: CheckpointMetadata, checkpoint: Checkpoint) => boolean;

/**
 * The default boundaries: where a run takes input (`source: 'input'`) and where a human or a
 * tool changed the state from outside (`update`, `fork`). The steps between are LangGraph's
 * per-superstep records, which compaction may remove once a later boundary exists.
 */
export const DEFAULT_BOUNDARY: BoundaryRule = (metadata) =>
  metadata.source === 'input' || metadata.source === 'update' || metadata.source === 'fork';

/** What createCairnSaver takes. */
export interface CairnSaverOptions {
  /**
   * The database, from createDb, or forTenant(db, tenant) to keep the tenant's threads apart
   * from every other tenant's (row-level security on the tenant's login role).
   */
  db: Db;
  /**
   * `refuse` (default): a put whose parent is not the thread's newest checkpoint is refused
   * with `checkpoint_conflict`, so two writers cannot fork a thread silently; the graph's
   * invoke rejects with that error. `allow`: LangGraph's own behaviour, for time travel
   * (resuming from an older checkpoint_id) and `durability: 'exit'`.
   */
  forks?: 'refuse' | 'allow';
  /** Signs every row (HMAC-SHA256); rows that are unsigned or signed by another key then do not verify. */
  keyRing?: KeyRing;
  /** Encrypts channel values and pending writes with the tenant's data key (needs a forTenant db). */
  keys?: TenantKeys;
  /** Which checkpoints are semantic boundaries ({@link DEFAULT_BOUNDARY}). */
  boundary?: BoundaryRule;
  /** LangGraph's serializer (default: its JsonPlusSerializer). */
  serde?: SerializerProtocol;
}

const CairnSaverOptionsSchema = optionsSchema<CairnSaverOptions>()(
  z.strictObject({
    db: opt.db(),
    forks: z.enum(['refuse', 'allow']).optional(),
    keyRing: z
      .strictObject({
        current: opt.text(),
        keys: z.record(
          z.string(),
          z.custom<Buffer>((v) => Buffer.isBuffer(v), { message: 'must be a Buffer (the key bytes)' }),
        ),
      })
      .optional(),
    keys: objectWith<TenantKeys>('TenantKeys (createTenantKeys())', 'seal', 'open').optional(),
    boundary: opt.fn<BoundaryRule>('a function (metadata, checkpoint) => boolean').optional(),
    serde: objectWith<SerializerProtocol>('a LangGraph serializer', 'dumpsTyped', 'loadsTyped').optional(),
  }),
);

/** A checkpoint the saver read but did not return, and why. */
export interface SkippedCheckpoint {
  threadId: string;
  checkpointNs: string;
  checkpointId: string;
  reason: string;
}

type Verified = { ok: true; tuple: CheckpointTuple } | { ok: false; message: string };

const decoder = new TextDecoder();

/** The `configurable` fields the saver reads, checked by name. */
function scopeOf(config: RunnableConfig, what: string, tenant: string): ThreadScope & { id?: string } {
  const c = config.configurable;
  if (c === undefined || c === null || typeof c !== 'object') {
    throw new ValidationError(what, [{ path: 'configurable', message: 'is required', value: c }]);
  }
  const thread = c.thread_id;
  if (typeof thread !== 'string' || thread === '') {
    throw new ValidationError(what, [
      {
        path: 'configurable.thread_id',
        message: 'must be a non-empty string: graph.invoke(input, { configurable: { thread_id } })',
        value: thread,
      },
    ]);
  }
  const ns = c.checkpoint_ns ?? '';
  if (typeof ns !== 'string') {
    throw new ValidationError(what, [
      { path: 'configurable.checkpoint_ns', message: 'must be a string', value: ns },
    ]);
  }
  const id = c.checkpoint_id;
  if (id !== undefined && id !== null && (typeof id !== 'string' || id === '')) {
    throw new ValidationError(what, [
      { path: 'configurable.checkpoint_id', message: 'must be a non-empty string', value: id },
    ]);
  }
  return { tenant, thread, ns, ...(id ? { id } : {}) };
}

const configOf = (s: ThreadScope, id: string): RunnableConfig => ({
  configurable: { thread_id: s.thread, checkpoint_ns: s.ns, checkpoint_id: id },
});

/**
 * A LangGraph checkpoint saver on Cairn's Postgres: LangGraph's contract (getTuple, list,
 * put, putWrites, deleteThread, namespaces, its serializer), and under it compare-and-swap
 * on the thread head, a digest on every row chained to the parent (signed with a key ring),
 * tenant isolation by row-level security, encryption with the tenant's data key, legal holds,
 * and compaction of the steps between semantic boundaries.
 */
export class CairnSaver extends BaseCheckpointSaver {
  private readonly db: Db;
  private readonly tenant: string;
  private readonly forks: 'refuse' | 'allow';
  private readonly keyRing: KeyRing | undefined;
  private readonly keys: TenantKeys | undefined;
  private readonly boundary: BoundaryRule;

  constructor(input: CairnSaverOptions) {
    const options = parseOptions('CairnSaver options', CairnSaverOptionsSchema, input);
    super(options.serde);
    this.db = options.db;
    this.tenant = tenantOf(options.db) ?? '';
    this.forks = options.forks ?? 'refuse';
    this.keyRing = options.keyRing;
    this.keys = options.keys;
    this.boundary = options.boundary ?? DEFAULT_BOUNDARY;
    if (this.keys && this.tenant === '') {
      throw new ConfigurationError(
        "CairnSaver: keys encrypt with a tenant's data key, and this db acts for no tenant: pass db: forTenant(db, tenant)",
      );
    }
  }

  /** Seals bytes with the tenant's data key when keys are configured. */
  private async seal(
    bytes: Buffer | null,
    aad: string,
  ): Promise<{ bytes: Buffer | null; keyId: string | null }> {
    if (!this.keys || bytes === null) return { bytes, keyId: null };
    const s = await this.keys.seal(this.tenant, bytes, aad);
    return { bytes: s.bytes, keyId: s.keyId };
  }

  /**
   * The plaintext of a stored value. A key provider that is down throws (UnavailableError):
   * an outage is never taken for corruption. Bytes that do not decrypt are corruption.
   */
  private async open(
    bytes: Buffer | null,
    keyId: string | null,
    aad: string,
  ): Promise<Buffer | null | string> {
    if (keyId === null || bytes === null) return bytes;
    if (!this.keys) {
      throw new CairnError(
        CairnErrorCodes.KeyMissing,
        `a LangGraph value is encrypted (key ${keyId}) and this CairnSaver has no tenant keys: pass keys`,
      );
    }
    try {
      return await this.keys.open(this.tenant, keyId, bytes, aad);
    } catch (err) {
      if (err instanceof CairnError && err.code === CairnErrorCodes.DecryptionFailed)
        return `does not decrypt: ${err.message}`;
      throw err;
    }
  }

  async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const s = scopeOf(config, 'CairnSaver.put config', this.tenant);
    const parentId = s.id ?? null;
    if (typeof checkpoint?.id !== 'string' || checkpoint.id === '') {
      throw new ValidationError('CairnSaver.put checkpoint', [
        { path: 'id', message: 'must be a non-empty string', value: checkpoint?.id },
      ]);
    }
    const { channel_values: values = {}, ...rest } = checkpoint;
    const [[cpType, cpBytes], [mdType, mdBytes]] = await Promise.all([
      this.serde.dumpsTyped(rest),
      this.serde.dumpsTyped(metadata),
    ]);
    const cp: TypedBytes = { type: cpType, bytes: Buffer.from(cpBytes) };
    const md: TypedBytes = { type: mdType, bytes: Buffer.from(mdBytes) };
    const blobs = await Promise.all(
      Object.entries(newVersions).map(async ([channel, ver]) => {
        const version = String(ver);
        const [type, bytes] =
          channel in values
            ? await this.serde.dumpsTyped((values as Record<string, unknown>)[channel])
            : ['empty', null];
        const plain: TypedBytes = { type, bytes: bytes === null ? null : Buffer.from(bytes) };
        const digest = blobDigest(s, channel, version, plain);
        const sealed = await this.seal(plain.bytes, `lg.blob:${s.thread}/${s.ns}/${channel}/${version}`);
        return { channel, version, type, ...sealed, digest, ...signDigest(digest, this.keyRing) };
      }),
    );
    const metadataJson =
      mdType === 'json' ? decoder.decode(mdBytes).replace(/\\u0000/g, '') : JSON.stringify({});
    const boundary = this.boundary(metadata, checkpoint) === true;

    let refused: string | undefined;
    try {
      await this.db.transaction().execute(async (trx) => {
        await lockThread(trx, s);
        const head = (await readHead(trx, s, parentId, checkpoint.id)).rows[0]!;
        const prevDigest = parentId === null ? null : head.parent_digest;
        const digest = checkpointDigest(s, { checkpointId: checkpoint.id, parentId, prevDigest }, cp, md);
        if (head.existing_digest !== null) {
          if (head.existing_digest === digest) return; // the same put again (a retry after a lost reply)
          refused = `checkpoint ${checkpoint.id} already exists in thread ${s.thread} with other content; checkpoints are never overwritten`;
          return;
        }
        // A put names the checkpoint it continues from; if that is no longer the head, another
        // writer moved the thread since this one read it. A put without a parent starts a
        // history (LangGraph's first checkpoint of a thread): two writers that both start one
        // on an empty thread are caught at the older one's next put, whose parent is then no
        // longer the head.
        if (this.forks === 'refuse' && parentId !== null && head.head !== parentId) {
          refused = `the parent ${parentId} is not the head of thread ${s.thread} (${head.head ?? 'none'}): another writer moved it, or this is a fork from an older checkpoint (forks: 'allow' permits them)`;
          return;
        }
        if (this.forks === 'refuse' && head.head !== null && checkpoint.id <= head.head) {
          refused = `checkpoint ${checkpoint.id} does not sort after the head ${head.head} of thread ${s.thread}: ids must grow along a thread`;
          return;
        }
        const sig = signDigest(digest, this.keyRing);
        await insertPut(trx, s, {
          blobs: {
            channel: blobs.map((b) => b.channel),
            version: blobs.map((b) => b.version),
            type: blobs.map((b) => b.type),
            blob: blobs.map((b) => b.bytes),
            key: blobs.map((b) => b.keyId),
            digest: blobs.map((b) => b.digest),
            sigKey: blobs.map((b) => b.sigKey),
            sig: blobs.map((b) => b.sig),
          },
          checkpoint: {
            id: checkpoint.id,
            parentId,
            bytes: cp.bytes!,
            type: cp.type,
            metadata: md.bytes!,
            metadataType: md.type,
            versions: JSON.stringify(checkpoint.channel_versions ?? {}),
            metadataJson,
            boundary,
            digest,
            prevDigest,
            sigKey: sig.sigKey,
            sig: sig.sig,
          },
        });
      });
    } catch (err) {
      rethrowMapped(err);
    }
    if (refused !== undefined) {
      await this.record(s, checkpoint.id, 'fork_refused', refused);
      throw new CairnError(CairnErrorCodes.CheckpointConflict, `CairnSaver.put refused: ${refused}`);
    }
    return configOf(s, checkpoint.id);
  }

  async putWrites(
    config: RunnableConfig,
    writes: PendingWrite[],
    taskId: string,
    taskPath = '',
  ): Promise<void> {
    const s = scopeOf(config, 'CairnSaver.putWrites config', this.tenant);
    if (!s.id) {
      throw new ValidationError('CairnSaver.putWrites config', [
        {
          path: 'configurable.checkpoint_id',
          message: 'is required: writes belong to a checkpoint',
          value: undefined,
        },
      ]);
    }
    const checkpointId = s.id;
    const rows = await Promise.all(
      writes.map(async ([channel, value], i) => {
        const idx = WRITES_IDX_MAP[channel] ?? i;
        const [type, bytes] = await this.serde.dumpsTyped(value);
        const plain = Buffer.from(bytes);
        const digest = writeDigest(
          s,
          { checkpointId, taskId, idx, taskPath, channel },
          { type, bytes: plain },
        );
        const sealed = await this.seal(
          plain,
          `lg.write:${s.thread}/${s.ns}/${checkpointId}/${taskId}/${idx}`,
        );
        return {
          idx,
          channel,
          type,
          blob: sealed.bytes!,
          key: sealed.keyId,
          digest,
          ...signDigest(digest, this.keyRing),
        };
      }),
    );
    if (rows.length === 0) return;
    try {
      await insertWrites(
        this.db,
        s,
        checkpointId,
        {
          taskId,
          taskPath,
          idx: rows.map((r) => r.idx),
          channel: rows.map((r) => r.channel),
          type: rows.map((r) => r.type),
          blob: rows.map((r) => r.blob),
          key: rows.map((r) => r.key),
          digest: rows.map((r) => r.digest),
          sigKey: rows.map((r) => r.sigKey),
          sig: rows.map((r) => r.sig),
        },
        writes.every(([channel]) => channel in WRITES_IDX_MAP),
      );
    } catch (err) {
      rethrowMapped(err);
    }
  }

  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const thread = config?.configurable?.thread_id;
    if (thread === undefined || thread === null) return undefined; // LangGraph's contract: no thread, no tuple
    const s = scopeOf(config, 'CairnSaver.getTuple config', this.tenant);
    const scope = sql`cp.tenant_id = ${s.tenant} AND cp.thread_id = ${s.thread} AND cp.checkpoint_ns = ${s.ns}`;
    if (s.id) {
      const { rows } = await selectCheckpoints(sql`${scope} AND cp.checkpoint_id = ${s.id}`, sql``).execute(
        this.db,
      );
      if (!rows[0]) return undefined;
      const v = await this.verify(rows[0]);
      if (v.ok) return v.tuple;
      await this.record(s, s.id, 'skipped_invalid', v.message);
      throw new CairnError(
        CairnErrorCodes.CheckpointInvalid,
        `checkpoint ${s.id} of thread ${s.thread} failed verification (${v.message}); it is never returned: read the thread without checkpoint_id to resume from the newest one that verifies`,
      );
    }
    // The newest checkpoint that verifies: a corrupt one is skipped (and recorded), as resume does.
    let before: string | undefined;
    for (;;) {
      const where = before === undefined ? scope : sql`${scope} AND cp.checkpoint_id < ${before}`;
      const { rows } = await selectCheckpoints(where, sql`ORDER BY cp.checkpoint_id DESC LIMIT 1`).execute(
        this.db,
      );
      const row = rows[0];
      if (!row) return undefined;
      const v = await this.verify(row);
      if (v.ok) return v.tuple;
      await this.record(s, row.checkpoint_id, 'skipped_invalid', v.message);
      before = row.checkpoint_id;
    }
  }

  async *list(config: RunnableConfig, options?: CheckpointListOptions): AsyncGenerator<CheckpointTuple> {
    const c = config?.configurable ?? {};
    const parts = [sql`cp.tenant_id = ${this.tenant}`];
    if (c.thread_id !== undefined && c.thread_id !== null && c.thread_id !== '') {
      parts.push(sql`cp.thread_id = ${String(c.thread_id)}`);
    }
    if (c.checkpoint_ns !== undefined && c.checkpoint_ns !== null)
      parts.push(sql`cp.checkpoint_ns = ${String(c.checkpoint_ns)}`);
    if (c.checkpoint_id) parts.push(sql`cp.checkpoint_id = ${String(c.checkpoint_id)}`);
    const { filter, before, limit } = options ?? {};
    if (filter && Object.keys(filter).length > 0)
      parts.push(sql`cp.metadata_json @> ${JSON.stringify(filter)}::jsonb`);
    const beforeId = before?.configurable?.checkpoint_id;
    if (beforeId !== undefined) parts.push(sql`cp.checkpoint_id < ${String(beforeId)}`);
    if (limit !== undefined && (!Number.isInteger(limit) || limit < 0)) {
      throw new ValidationError('CairnSaver.list options', [
        { path: 'limit', message: 'must be a whole number, 0 or more', value: limit },
      ]);
    }
    const tail =
      limit === undefined
        ? sql`ORDER BY cp.checkpoint_id DESC`
        : sql`ORDER BY cp.checkpoint_id DESC LIMIT ${limit}`;
    const { rows } = await selectCheckpoints(sql.join(parts, sql` AND `), tail).execute(this.db);
    for (const row of rows) {
      const v = await this.verify(row);
      if (v.ok) {
        yield v.tuple;
        continue;
      }
      await this.record(
        { tenant: this.tenant, thread: row.thread_id, ns: row.checkpoint_ns },
        row.checkpoint_id,
        'skipped_invalid',
        v.message,
      );
    }
  }

  async deleteThread(threadId: string): Promise<void> {
    if (typeof threadId !== 'string' || threadId === '') {
      throw new ValidationError('CairnSaver.deleteThread', [
        { path: 'threadId', message: 'must be a non-empty string', value: threadId },
      ]);
    }
    try {
      await sql`
        WITH w AS (DELETE FROM lg_write WHERE tenant_id = ${this.tenant} AND thread_id = ${threadId}),
             b AS (DELETE FROM lg_blob WHERE tenant_id = ${this.tenant} AND thread_id = ${threadId}),
             z AS (DELETE FROM lg_compacted WHERE tenant_id = ${this.tenant} AND thread_id = ${threadId})
        DELETE FROM lg_checkpoint WHERE tenant_id = ${this.tenant} AND thread_id = ${threadId}
      `.execute(this.db);
    } catch (err) {
      rethrowMapped(err);
    }
  }

  /** Marks a stored checkpoint as a semantic boundary (compaction keeps it). */
  async markBoundary(config: RunnableConfig): Promise<boolean> {
    const s = scopeOf(config, 'CairnSaver.markBoundary config', this.tenant);
    if (!s.id) {
      throw new ValidationError('CairnSaver.markBoundary config', [
        { path: 'configurable.checkpoint_id', message: 'is required', value: undefined },
      ]);
    }
    const r = await sql`
      UPDATE lg_checkpoint SET boundary = true
       WHERE tenant_id = ${s.tenant} AND thread_id = ${s.thread} AND checkpoint_ns = ${s.ns} AND checkpoint_id = ${s.id}
    `.execute(this.db);
    return Number(r.numAffectedRows ?? 0) > 0;
  }

  /**
   * Removes the per-step checkpoints of a thread that lie before its newest boundary and are
   * not boundaries themselves, with their pending writes and the blobs no remaining checkpoint
   * names. Each removed checkpoint's digest is kept, so its child's chain still verifies.
   * The head and everything after the newest boundary stay. Refused under a legal hold.
   */
  async compact(threadId: string): Promise<{ removed: number }> {
    if (typeof threadId !== 'string' || threadId === '') {
      throw new ValidationError('CairnSaver.compact', [
        { path: 'threadId', message: 'must be a non-empty string', value: threadId },
      ]);
    }
    try {
      return await this.db.transaction().execute(async (trx) => {
        const { rows } = await sql<{ removed: string }>`
          WITH last AS (
            SELECT checkpoint_ns, max(checkpoint_id) AS boundary_id FROM lg_checkpoint
             WHERE tenant_id = ${this.tenant} AND thread_id = ${threadId} AND boundary
             GROUP BY checkpoint_ns
          ), victims AS (
            SELECT c.checkpoint_ns, c.checkpoint_id, c.digest FROM lg_checkpoint c JOIN last l USING (checkpoint_ns)
             WHERE c.tenant_id = ${this.tenant} AND c.thread_id = ${threadId} AND NOT c.boundary
               AND c.checkpoint_id < l.boundary_id
          ), kept AS (
            INSERT INTO lg_compacted (tenant_id, thread_id, checkpoint_ns, checkpoint_id, digest)
            SELECT ${this.tenant}, ${threadId}, checkpoint_ns, checkpoint_id, digest FROM victims
            ON CONFLICT DO NOTHING
          ), writes AS (
            DELETE FROM lg_write w USING victims v
             WHERE w.tenant_id = ${this.tenant} AND w.thread_id = ${threadId}
               AND w.checkpoint_ns = v.checkpoint_ns AND w.checkpoint_id = v.checkpoint_id
          ), gone AS (
            DELETE FROM lg_checkpoint c USING victims v
             WHERE c.tenant_id = ${this.tenant} AND c.thread_id = ${threadId}
               AND c.checkpoint_ns = v.checkpoint_ns AND c.checkpoint_id = v.checkpoint_id
            RETURNING 1
          )
          SELECT count(*) AS removed FROM gone
        `.execute(trx);
        await sql`
          DELETE FROM lg_blob b
           WHERE b.tenant_id = ${this.tenant} AND b.thread_id = ${threadId}
             AND NOT EXISTS (
               SELECT 1 FROM lg_checkpoint c
                WHERE c.tenant_id = b.tenant_id AND c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns
                  AND c.versions ->> b.channel = b.version)
        `.execute(trx);
        return { removed: Number(rows[0]?.removed ?? 0) };
      });
    } catch (err) {
      rethrowMapped(err);
    }
  }

  /** The checkpoints the saver skipped or refused in a thread, oldest first. */
  async events(threadId: string): Promise<Array<SkippedCheckpoint & { event: string; at: Date }>> {
    const { rows } = await sql<{
      thread_id: string;
      checkpoint_ns: string;
      checkpoint_id: string;
      event: string;
      detail: string;
      at: Date;
    }>`
      SELECT thread_id, checkpoint_ns, checkpoint_id, event, detail, at FROM lg_event
       WHERE tenant_id = ${this.tenant} AND thread_id = ${threadId} ORDER BY id
    `.execute(this.db);
    return rows.map((r) => ({
      threadId: r.thread_id,
      checkpointNs: r.checkpoint_ns,
      checkpointId: r.checkpoint_id,
      event: r.event,
      reason: r.detail,
      at: r.at,
    }));
  }

  /** Records a skipped or refused checkpoint once (reading it again adds nothing). */
  private async record(s: ThreadScope, checkpointId: string, event: string, detail: string): Promise<void> {
    await sql`
      INSERT INTO lg_event (tenant_id, thread_id, checkpoint_ns, checkpoint_id, event, detail)
      VALUES (${s.tenant}, ${s.thread}, ${s.ns}, ${checkpointId}, ${event}, ${detail.slice(0, 2000)})
      ON CONFLICT DO NOTHING
    `.execute(this.db);
  }

  /** Checks a row, its parent link, its blobs and its writes; decodes them when all hold. */
  private async verify(row: CheckpointRow): Promise<Verified> {
    const s: ThreadScope = { tenant: this.tenant, thread: row.thread_id, ns: row.checkpoint_ns };
    const bad = (message: string): Verified => ({ ok: false, message });
    const cp: TypedBytes = { type: row.checkpoint_type, bytes: row.checkpoint };
    const md: TypedBytes = { type: row.metadata_type, bytes: row.metadata };
    const parentId = row.parent_checkpoint_id;
    const digest = checkpointDigest(
      s,
      { checkpointId: row.checkpoint_id, parentId, prevDigest: row.prev_digest },
      cp,
      md,
    );
    if (digest !== row.digest) return bad('its bytes do not match its digest');
    const sigProblem = signatureProblem(digest, { sigKey: row.sig_key, sig: row.sig }, this.keyRing);
    if (sigProblem) return bad(`checkpoint ${sigProblem}`);
    if (parentId !== null && row.prev_digest !== null && row.parent_digest !== row.prev_digest) {
      return bad(
        row.parent_digest === null
          ? `its parent ${parentId} is gone (deleted, not compacted)`
          : `its parent ${parentId} changed since it was written (chain broken)`,
      );
    }

    let checkpoint: Checkpoint;
    let metadata: CheckpointMetadata;
    try {
      checkpoint = await this.serde.loadsTyped(cp.type, row.checkpoint);
      metadata = await this.serde.loadsTyped(md.type, row.metadata);
    } catch (err) {
      return bad(`does not decode: ${(err as Error).message}`);
    }
    const versions = checkpoint.channel_versions ?? {};
    const channelValues: Record<string, unknown> = {};
    const n = row.b_channel?.length ?? 0;
    for (let i = 0; i < n; i++) {
      const channel = row.b_channel![i]!;
      const version = row.b_version![i]!;
      if (String(versions[channel]) !== version) continue; // not this checkpoint's version
      const plain = await this.open(
        row.b_blob![i] ?? null,
        row.b_key![i] ?? null,
        `lg.blob:${s.thread}/${s.ns}/${channel}/${version}`,
      );
      if (typeof plain === 'string') return bad(`channel ${channel} ${plain}`);
      const type = row.b_type![i]!;
      const d = blobDigest(s, channel, version, { type, bytes: plain });
      if (d !== row.b_digest![i])
        return bad(`channel ${channel} (version ${version}) does not match its digest`);
      const p = signatureProblem(
        d,
        { sigKey: row.b_sig_key![i] ?? null, sig: row.b_sig![i] ?? null },
        this.keyRing,
      );
      if (p) return bad(`channel ${channel} ${p}`);
      if (type !== 'empty' && plain !== null)
        channelValues[channel] = await this.serde.loadsTyped(type, plain);
    }
    const pendingWrites: CheckpointPendingWrite[] = [];
    const m = row.w_task?.length ?? 0;
    for (let i = 0; i < m; i++) {
      const w = await this.openWrite(s, {
        checkpoint_id: row.checkpoint_id,
        task_id: row.w_task![i]!,
        idx: row.w_idx![i]!,
        task_path: row.w_path![i]!,
        channel: row.w_channel![i]!,
        type: row.w_type![i]!,
        blob: row.w_blob![i]!,
        key_id: row.w_key![i] ?? null,
        digest: row.w_digest![i]!,
        sig_key: row.w_sig_key![i] ?? null,
        sig: row.w_sig![i] ?? null,
      });
      if (!w.ok) return bad(w.message);
      pendingWrites.push([w.row.task_id, w.row.channel, w.value]);
    }
    checkpoint.channel_values = channelValues;
    checkpoint.channel_versions = versions;
    checkpoint.versions_seen = checkpoint.versions_seen ?? {};
    if (checkpoint.v < 4 && parentId !== null) {
      const sends = await this.pendingSends(s, parentId);
      if (!sends.ok) return bad(sends.message);
      checkpoint.channel_values[TASKS] = sends.values;
      const all = Object.values(checkpoint.channel_versions);
      checkpoint.channel_versions[TASKS] =
        all.length > 0 ? maxChannelVersion(...all) : this.getNextVersion(undefined);
    }
    return {
      ok: true,
      tuple: {
        config: configOf(s, row.checkpoint_id),
        checkpoint,
        metadata,
        ...(parentId !== null ? { parentConfig: configOf(s, parentId) } : {}),
        pendingWrites,
      },
    };
  }

  private async openWrite(
    s: ThreadScope,
    r: WriteRow,
  ): Promise<{ ok: true; row: WriteRow; value: unknown } | { ok: false; message: string }> {
    const plain = await this.open(
      r.blob,
      r.key_id,
      `lg.write:${s.thread}/${s.ns}/${r.checkpoint_id}/${r.task_id}/${r.idx}`,
    );
    if (typeof plain === 'string')
      return { ok: false, message: `pending write ${r.task_id}/${r.idx} ${plain}` };
    const d = writeDigest(
      s,
      {
        checkpointId: r.checkpoint_id,
        taskId: r.task_id,
        idx: r.idx,
        taskPath: r.task_path,
        channel: r.channel,
      },
      { type: r.type, bytes: plain },
    );
    if (d !== r.digest)
      return { ok: false, message: `pending write ${r.task_id}/${r.idx} does not match its digest` };
    const p = signatureProblem(d, { sigKey: r.sig_key, sig: r.sig } satisfies RowSignature, this.keyRing);
    if (p) return { ok: false, message: `pending write ${r.task_id}/${r.idx} ${p}` };
    return { ok: true, row: r, value: await this.serde.loadsTyped(r.type, plain!) };
  }

  /** Checkpoints before format 4 kept pending sends as the parent's TASKS writes. */
  private async pendingSends(
    s: ThreadScope,
    parentId: string,
  ): Promise<{ ok: true; values: unknown[] } | { ok: false; message: string }> {
    const { rows } = await selectPendingSends(s, TASKS, [parentId]).execute(this.db);
    const values: unknown[] = [];
    for (const r of rows) {
      const w = await this.openWrite(s, r);
      if (!w.ok) return w;
      values.push(w.value);
    }
    return { ok: true, values };
  }
}

/** Makes a CairnSaver (the class is exported too, for `instanceof`). */
export function createCairnSaver(options: CairnSaverOptions): CairnSaver {
  return new CairnSaver(options);
}
