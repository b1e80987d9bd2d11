import {
  type Checkpoint,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  maxChannelVersion,
  type SerializerProtocol,
  TASKS,
} from '@langchain/langgraph-checkpoint';
import { canonicalBytes } from '../src/canonical.js';
import type { KeyRing } from '../src/checkpoints/signing.js';
import type { TenantKeys } from '../src/crypto/tenantKeys.js';
import type { Db } from '../src/db/database.js';
import { CairnError, CairnErrorCodes, ConfigurationError, messageOf } from '../src/errors.js';
import {
  blobDigest,
  checkpointDigest,
  metadataJsonText,
  type RowSignature,
  signatureProblem,
  signDigest,
  type ThreadScope,
  type TypedBytes,
  writeDigest,
} from './integrity.js';
import { configOf } from './options.js';
import type { CheckpointRow } from './sql/selectCheckpoints.js';
import { selectPendingSends, type WriteRow } from './sql/writes.js';

const sameJson = (a: unknown, b: unknown): boolean => canonicalBytes(a).equals(canonicalBytes(b));

/** A value as stored: its bytes (sealed or not), the data key's id, its digest and signature. */
export interface SealedValue extends RowSignature {
  blob: Buffer | null;
  key: string | null;
  digest: string;
}

/** What the codec needs of its saver. */
export interface RowCodecContext {
  db: Db;
  /** The tenant the saver acts for ('' for none). */
  tenant: string;
  serde: SerializerProtocol;
  keyRing: KeyRing | undefined;
  keys: TenantKeys | undefined;
  /** The saver's first channel version. */
  nextVersion(): number;
}

/** A stored checkpoint that verified, decoded; or what was wrong with it. */
export type Verified = { ok: true; tuple: CheckpointTuple } | { ok: false; message: string };

/**
 * Encrypts what the saver stores (with the tenant's data key, when keys are configured) and
 * checks and decodes what it reads: digests, signatures, the chain to the parent.
 */
export class RowCodec {
  constructor(private readonly ctx: RowCodecContext) {}

  /** Signs a digest with the saver's key ring (nothing without one). */
  sign(digest: string): RowSignature {
    return signDigest(digest, this.ctx.keyRing);
  }

  /**
   * A value ready to store: sealed with the tenant's data key when keys are configured, and
   * its digest (of the plaintext) signed together with that key's id.
   */
  async sealValue(digest: string, bytes: Buffer | null, aad: string): Promise<SealedValue> {
    let blob = bytes;
    let key: string | null = null;
    if (this.ctx.keys && bytes !== null) {
      const sealed = await this.ctx.keys.seal(this.ctx.tenant, bytes, aad);
      blob = sealed.bytes;
      key = sealed.keyId;
    }
    return { blob, key, digest, ...signDigest(digest, this.ctx.keyRing, key) };
  }

  /**
   * The plaintext of a stored value. A key provider that is down (UnavailableError) or a data
   * key that does not unwrap under its keyring (key_unavailable) throws: an outage is never
   * taken for corruption. Only a payload that fails its own authentication is corruption.
   */
  private async open(
    bytes: Buffer | null,
    keyId: string | null,
    aad: string,
  ): Promise<Buffer | null | string> {
    if (keyId === null || bytes === null) return bytes;
    if (!this.ctx.keys) {
      throw new CairnError(
        CairnErrorCodes.KeyMissing,
        `a LangGraph value is encrypted (key ${keyId}) and this CairnSaver has no tenant keys: pass keys`,
      );
    }
    try {
      return await this.ctx.keys.open(this.ctx.tenant, keyId, bytes, aad);
    } catch (err) {
      if (err instanceof CairnError && err.code === CairnErrorCodes.DecryptionFailed)
        return `does not decrypt: ${err.message}`;
      throw err;
    }
  }

  /** Checks a row, its parent link, its blobs and its writes; decodes them when all hold. */
  async verify(row: CheckpointRow): Promise<Verified> {
    const s: ThreadScope = { tenant: this.ctx.tenant, thread: row.thread_id, ns: row.checkpoint_ns };
    const bad = (message: string): Verified => ({ ok: false, message });
    const cp: TypedBytes = { type: row.checkpoint_type, bytes: row.checkpoint };
    const md: TypedBytes = { type: row.metadata_type, bytes: row.metadata };
    const parentId = row.parent_checkpoint_id;
    const digest = checkpointDigest(
      s,
      { checkpointId: row.checkpoint_id, parentId, prevDigest: row.prev_digest, blobs: row.blob_digests },
      cp,
      md,
    );
    if (digest !== row.digest) return bad('its bytes do not match its digest');
    const sigProblem = signatureProblem(digest, { sigKey: row.sig_key, sig: row.sig }, this.ctx.keyRing);
    if (sigProblem) return bad(`checkpoint ${sigProblem}`);
    if (parentId !== null && row.prev_digest !== null && row.parent_digest !== row.prev_digest) {
      return bad(
        row.parent_digest === null
          ? `its parent ${parentId} is gone (deleted, not compacted)`
          : `its parent ${parentId} changed since it was written (chain broken)`,
      );
    }

    const at = { s, checkpointId: row.checkpoint_id };
    const checkpoint: Checkpoint = await this.decode(
      { ...at, what: 'its checkpoint' },
      cp.type,
      row.checkpoint,
    );
    const metadata: CheckpointMetadata = await this.decode(
      { ...at, what: 'its metadata' },
      md.type,
      row.metadata,
    );
    const versions = checkpoint.channel_versions ?? {};
    // The SQL copies (the blob join, list filters) must say what the verified bytes say.
    if (!sameJson(row.versions, versions))
      return bad('its versions column differs from its verified versions');
    let metadataCopy: unknown;
    try {
      metadataCopy = JSON.parse(metadataJsonText(md));
    } catch (err) {
      return bad(`its metadata is not JSON: ${(err as Error).name}`);
    }
    if (!sameJson(row.metadata_json, metadataCopy)) {
      return bad('its metadata_json column differs from its verified metadata');
    }
    const channelValues: Record<string, unknown> = {};
    const loaded = new Map<string, string>();
    const n = row.b_channel?.length ?? 0;
    for (let i = 0; i < n; i++) {
      const channel = row.b_channel![i]!;
      const version = row.b_version![i]!;
      if (String(versions[channel]) !== version) continue; // not this checkpoint's version
      // The signature first: it vouches for the stored digest and the data key's id, so a
      // key id that was tampered with is corruption, and a vouched-for key that cannot be
      // had is an outage.
      const p = signatureProblem(
        row.b_digest![i]!,
        { sigKey: row.b_sig_key![i] ?? null, sig: row.b_sig![i] ?? null },
        this.ctx.keyRing,
        row.b_key![i] ?? null,
      );
      if (p) return bad(`channel ${channel} ${p}`);
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
      loaded.set(channel, d);
      if (type !== 'empty' && plain !== null)
        channelValues[channel] = await this.decode(
          { ...at, what: `channel ${channel} (version ${version})` },
          type,
          plain,
        );
    }
    // The values this checkpoint wrote itself are named in its digest: none may be missing or replaced.
    for (const [channel, [version, d]] of Object.entries(row.blob_digests)) {
      if (String(versions[channel]) !== version || loaded.get(channel) === d) continue;
      return bad(
        loaded.has(channel)
          ? `channel ${channel} (version ${version}) is not the value this checkpoint wrote`
          : `channel ${channel} (version ${version}) is missing`,
      );
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
        all.length > 0 ? maxChannelVersion(...all) : this.ctx.nextVersion();
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
    const p = signatureProblem(
      r.digest,
      { sigKey: r.sig_key, sig: r.sig } satisfies RowSignature,
      this.ctx.keyRing,
      r.key_id,
    );
    if (p) return { ok: false, message: `pending write ${r.task_id}/${r.idx} ${p}` };
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
    const value = await this.decode(
      { s, checkpointId: r.checkpoint_id, what: `pending write ${r.task_id}/${r.idx}` },
      r.type,
      plain!,
    );
    return { ok: true, row: r, value };
  }

  /**
   * A value that verified (digest, signature), decoded by the saver's serializer. A failure here
   * is the reader's (a serializer of an older release that does not know what a newer one
   * wrote), never the row's: it throws and nothing is recorded. Recorded as skipped_invalid, the
   * checkpoint would be no head for cairn_lg_put for good, and the thread stuck once the reader
   * is upgraded (invariant 13: a reader's limitation is not corruption).
   */
  private async decode(
    at: { s: ThreadScope; checkpointId: string; what: string },
    type: string,
    bytes: Uint8Array,
  ) {
    try {
      return await this.ctx.serde.loadsTyped(type, bytes);
    } catch (err) {
      const ns = at.s.ns === '' ? '' : ` (namespace ${at.s.ns})`;
      throw new ConfigurationError(
        `CairnSaver: checkpoint ${at.checkpointId} of thread ${at.s.thread}${ns} verifies, but ${at.what} ` +
          `(type ${type}) does not decode with this saver's serializer: ${messageOf(err)}. It is not corrupt ` +
          'and was neither skipped nor recorded: read the thread with the serializer (the release) that wrote it',
        err,
      );
    }
  }

  /** Checkpoints before format 4 kept pending sends as the parent's TASKS writes. */
  private async pendingSends(
    s: ThreadScope,
    parentId: string,
  ): Promise<{ ok: true; values: unknown[] } | { ok: false; message: string }> {
    const { rows } = await selectPendingSends(s, TASKS, [parentId]).execute(this.ctx.db);
    const values: unknown[] = [];
    for (const r of rows) {
      const w = await this.openWrite(s, r);
      if (!w.ok) return w;
      values.push(w.value);
    }
    return { ok: true, values };
  }
}
