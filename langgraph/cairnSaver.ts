import { randomInt, randomUUID } from 'node:crypto';
import type { RunnableConfig } from '@langchain/core/runnables';
import {
  BaseCheckpointSaver,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointTuple,
  type PendingWrite,
  WRITES_IDX_MAP,
} from '@langchain/langgraph-checkpoint';
import { sql } from 'kysely';
import type { Db } from '../src/db/database.js';
import { rethrowMapped } from '../src/db/sqlstate.js';
import { tenantOf } from '../src/db/tenant.js';
import { CairnError, CairnErrorCodes, ConfigurationError, ValidationError } from '../src/errors.js';
import { parseOptions } from '../src/options.js';
import { compactThread } from './compaction.js';
import { DigestCache } from './digestCache.js';
import { blobDigest, checkpointDigest, metadataJsonText, type TypedBytes, writeDigest } from './integrity.js';
import {
  type BoundaryRule,
  type CairnSaverOptions,
  CairnSaverOptionsSchema,
  configOf,
  DEFAULT_BOUNDARY,
  requireCheckpointId,
  requireThreadId,
  scopeOf,
} from './options.js';
import { RowCodec } from './rowCodec.js';
import { toColumns } from './sql/columns.js';
import { type PutOutcome, putCheckpoint, refusalOf } from './sql/putCheckpoint.js';
import { selectCheckpoints } from './sql/selectCheckpoints.js';
import {
  deleteThreadRows,
  listEvents,
  markBoundaryRow,
  recordEvent,
  type ThreadEvent,
} from './sql/threadMaintenance.js';
import { insertWrites } from './sql/writes.js';

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
  private readonly boundary: BoundaryRule;
  private readonly codec: RowCodec;
  private readonly digests = new DigestCache();
  /** This instance's writer id: it may start a history on a thread whose head it wrote itself. */
  private readonly writerId = randomUUID();

  constructor(input: CairnSaverOptions) {
    const options = parseOptions('CairnSaver options', CairnSaverOptionsSchema, input);
    super(options.serde);
    this.db = options.db;
    this.tenant = tenantOf(options.db) ?? '';
    this.forks = options.forks ?? 'refuse';
    this.boundary = options.boundary ?? DEFAULT_BOUNDARY;
    if (options.keys && this.tenant === '') {
      throw new ConfigurationError(
        "CairnSaver: keys encrypt with a tenant's data key, and this db acts for no tenant: pass db: forTenant(db, tenant)",
      );
    }
    this.codec = new RowCodec({
      db: this.db,
      tenant: this.tenant,
      serde: this.serde,
      keyRing: options.keyRing,
      keys: options.keys,
      nextVersion: () => this.getNextVersion(undefined),
    });
  }

  /**
   * Channel versions unique to the history that makes them (LangGraph Python's Postgres saver
   * adds a random suffix for the same reason): the next whole number plus a random fraction,
   * still a number as LangGraph JS's types want, still increasing. Values are stored once per
   * channel and version, so with plain counters a graph resumed from an older checkpoint (after
   * a corrupt newer one, or a fork) would reuse a version another history already stored: its
   * put refused as a conflict, or the corrupt value read back.
   */
  override getNextVersion(current: number | undefined): number {
    return Math.floor(current ?? 0) + 1 + randomInt(1, 1_000_000) / 1_000_000;
  }

  /**
   * Stores a checkpoint (its channel values as blobs, once per channel version) in one
   * transaction, after checking under a per-thread lock that its parent is still the head
   * (forks: 'refuse'). Refused puts throw `checkpoint_conflict` and are recorded in `events`.
   */
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
        const plain = bytes === null ? null : Buffer.from(bytes);
        const digest = blobDigest(s, channel, version, { type, bytes: plain });
        const sealed = await this.codec.sealValue(
          digest,
          plain,
          `lg.blob:${s.thread}/${s.ns}/${channel}/${version}`,
        );
        return { channel, version, type, ...sealed };
      }),
    );
    const boundary = this.boundary(metadata, checkpoint) === true;
    const blobMap: Record<string, [string, string]> = Object.fromEntries(
      blobs.map((b) => [b.channel, [b.version, b.digest]]),
    );
    const rows = toColumns(blobs, ['channel', 'version', 'type', 'blob', 'key', 'digest', 'sigKey', 'sig']);
    // The parent's digest, as this saver last wrote or read it; cairn_lg_put checks it under
    // the thread's lock and returns the stored one when it differs (then the put is computed
    // again, once).
    const known = parentId === null ? undefined : this.digests.get(s, parentId);
    let prevDigest = known ?? null;
    let refused: string | undefined;
    for (let attempt = 0; refused === undefined; attempt++) {
      const digest = checkpointDigest(
        s,
        { checkpointId: checkpoint.id, parentId, prevDigest, blobs: blobMap },
        cp,
        md,
      );
      const sig = this.codec.sign(digest);
      let r: { outcome: PutOutcome; head: string | null; parent_digest: string | null };
      try {
        r = (
          await putCheckpoint(
            this.db,
            s,
            { id: this.writerId, refuseForks: this.forks === 'refuse' },
            {
              blobs: rows,
              checkpoint: {
                id: checkpoint.id,
                parentId,
                bytes: cp.bytes!,
                type: cp.type,
                metadata: md.bytes!,
                metadataType: md.type,
                versions: JSON.stringify(checkpoint.channel_versions ?? {}),
                metadataJson: metadataJsonText(md),
                boundary,
                digest,
                prevDigest,
                blobDigests: JSON.stringify(blobMap),
                sigKey: sig.sigKey,
                sig: sig.sig,
              },
            },
          )
        ).rows[0]!;
      } catch (err) {
        rethrowMapped(err);
      }
      switch (r.outcome) {
        case 'ok':
        case 'exists': // the same put again (a retry after a lost reply)
          this.digests.remember(s, checkpoint.id, digest);
          return configOf(s, checkpoint.id);
        case 'parent_digest':
          // Not known here: take the stored one (the next read of the parent verifies it). Known
          // and different: the parent row was replaced since this saver wrote or read it.
          if (attempt === 0 && known === undefined) {
            prevDigest = r.parent_digest;
            continue;
          }
          refused = refusalOf(r, { thread: s.thread, id: checkpoint.id, parentId });
          break;
        default:
          refused = refusalOf(r, { thread: s.thread, id: checkpoint.id, parentId });
      }
    }
    await recordEvent(this.db, { ...s, checkpointId: checkpoint.id }, 'fork_refused', refused);
    throw new CairnError(CairnErrorCodes.CheckpointConflict, `CairnSaver.put refused: ${refused}`);
  }

  /** Stores a task's pending writes for a checkpoint (LangGraph's pending work), each row digested and signed. */
  async putWrites(
    config: RunnableConfig,
    writes: PendingWrite[],
    taskId: string,
    taskPath = '',
  ): Promise<void> {
    const s = scopeOf(config, 'CairnSaver.putWrites config', this.tenant);
    const checkpointId = requireCheckpointId(s, 'CairnSaver.putWrites config');
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
        const sealed = await this.codec.sealValue(
          digest,
          plain,
          `lg.write:${s.thread}/${s.ns}/${checkpointId}/${taskId}/${idx}`,
        );
        return { idx, channel, type, ...sealed, blob: sealed.blob! };
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
          ...toColumns(rows, ['idx', 'channel', 'type', 'blob', 'key', 'digest', 'sigKey', 'sig']),
        },
        writes.every(([channel]) => channel in WRITES_IDX_MAP),
      );
    } catch (err) {
      rethrowMapped(err);
    }
  }

  /**
   * The checkpoint named by `checkpoint_id`, or the thread's newest one that verifies: a
   * corrupt newer one is skipped and recorded, as `resume` does. A checkpoint asked for by id
   * that fails verification throws `checkpoint_invalid`; it is never returned. One that verifies
   * but that this saver's serializer cannot decode throws ConfigurationError and is not recorded:
   * it is the reader's limitation, and the writer may go on from it.
   */
  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const thread = config?.configurable?.thread_id;
    if (thread === undefined || thread === null) return undefined; // LangGraph's contract: no thread, no tuple
    const s = scopeOf(config, 'CairnSaver.getTuple config', this.tenant);
    const scope = sql`cp.tenant_id = ${s.tenant} AND cp.thread_id = ${s.thread} AND cp.checkpoint_ns = ${s.ns}`;
    if (s.id) {
      const { rows } = await selectCheckpoints(sql`${scope} AND cp.checkpoint_id = ${s.id}`, sql``, {
        prepared: true,
      }).execute(this.db);
      if (!rows[0]) return undefined;
      const v = await this.codec.verify(rows[0]);
      if (v.ok) {
        this.digests.remember(s, s.id, rows[0].digest);
        return v.tuple;
      }
      await recordEvent(this.db, { ...s, checkpointId: s.id }, 'skipped_invalid', v.message);
      throw new CairnError(
        CairnErrorCodes.CheckpointInvalid,
        `checkpoint ${s.id} of thread ${s.thread} failed verification (${v.message}); it is never returned: read the thread without checkpoint_id to resume from the newest one that verifies`,
      );
    }
    // The newest checkpoint that verifies: a corrupt one is skipped (and recorded), as resume does.
    let before: string | undefined;
    for (;;) {
      const where = before === undefined ? scope : sql`${scope} AND cp.checkpoint_id < ${before}`;
      const { rows } = await selectCheckpoints(where, sql`ORDER BY cp.checkpoint_id DESC LIMIT 1`, {
        prepared: true,
      }).execute(this.db);
      const row = rows[0];
      if (!row) return undefined;
      const v = await this.codec.verify(row);
      if (v.ok) {
        this.digests.remember(s, row.checkpoint_id, row.digest);
        return v.tuple;
      }
      await recordEvent(this.db, { ...s, checkpointId: row.checkpoint_id }, 'skipped_invalid', v.message);
      before = row.checkpoint_id;
    }
  }

  /** Checkpoints newest first (thread, namespace, metadata filter, before, limit); those that fail verification are skipped and recorded. */
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
      const v = await this.codec.verify(row);
      if (v.ok) {
        this.digests.remember(
          { tenant: this.tenant, thread: row.thread_id, ns: row.checkpoint_ns },
          row.checkpoint_id,
          row.digest,
        );
        yield v.tuple;
        continue;
      }
      await recordEvent(
        this.db,
        { thread: row.thread_id, ns: row.checkpoint_ns, checkpointId: row.checkpoint_id },
        'skipped_invalid',
        v.message,
      );
    }
  }

  /** Deletes a thread's checkpoints, values and writes in every namespace; refused under a legal hold. */
  async deleteThread(threadId: string): Promise<void> {
    requireThreadId('CairnSaver.deleteThread', threadId);
    try {
      await deleteThreadRows(this.db, this.tenant, threadId);
    } catch (err) {
      rethrowMapped(err);
    }
  }

  /** Marks a stored checkpoint as a semantic boundary (compaction keeps it); false when there is no such checkpoint. */
  async markBoundary(config: RunnableConfig): Promise<boolean> {
    const s = scopeOf(config, 'CairnSaver.markBoundary config', this.tenant);
    const r = await markBoundaryRow(
      this.db,
      s.tenant,
      s.thread,
      s.ns,
      requireCheckpointId(s, 'CairnSaver.markBoundary config'),
    );
    return Number(r.numAffectedRows ?? 0) > 0;
  }

  /**
   * Removes the per-step checkpoints of a thread that lie before its newest boundary: under
   * the thread's lock, each namespace's history is walked from its newest checkpoint that
   * verifies, through parents that verify; the non-boundary checkpoints on that chain older
   * than its newest boundary go, with their pending writes and the values nothing else names.
   * Rows that fail verification and other branches are left alone. Each removed checkpoint's
   * digest is kept, so its child's chain still verifies. Refused under a legal hold.
   */
  async compact(threadId: string): Promise<{ removed: number }> {
    requireThreadId('CairnSaver.compact', threadId);
    try {
      return await compactThread(this.db, this.codec, this.tenant, threadId);
    } catch (err) {
      rethrowMapped(err);
    }
  }

  /** What the saver skipped or refused in a thread, oldest first. */
  async events(threadId: string): Promise<ThreadEvent[]> {
    requireThreadId('CairnSaver.events', threadId);
    return listEvents(this.db, this.tenant, threadId);
  }
}

/** Makes a CairnSaver (the class is exported too, for `instanceof`). */
export function createCairnSaver(options: CairnSaverOptions): CairnSaver {
  return new CairnSaver(options);
}
