import type { Pgoutput } from 'pg-logical-replication';
import { laneOf } from '../../src/outbox/lanes.js';
import type { ClaimedRow } from '../sql/claimBatch.js';
import { type MessageHeader, readHeader } from './walHeader.js';

/**
 * An outbox row as the WAL delivered it, and where its transaction ends: set on the last row
 * of a transaction only. Once every row up to it is published or left in the table, the slot
 * may be confirmed up to `endLsn`.
 */
export interface StreamRow extends ClaimedRow {
  endLsn?: bigint;
  /** The transaction (32-bit xid) that wrote it: the sweep waits until it is visible (relay/wal/walRouting.ts). */
  xid: number;
  /**
   * Not a row: a transaction too large to buffer was dropped from memory; its rows are in the
   * table, and the relay reads them from there (it holds every lane).
   */
  overflow?: true;
  /** A WAL message's own position in the WAL (as the server spells it): where a slot delivering it again starts. */
  walLsn?: string;
}

/** Postgres' epoch (2000-01-01) in Unix milliseconds: timestamptz is microseconds since it. */
const PG_EPOCH_MS = 946_684_800_000;

/** An LSN as pgoutput-logical-replication spells it ("16/B374D848") as a number to compare. */
export function lsnOf(text: string | null | undefined): bigint | undefined {
  if (!text) return undefined;
  const [hi, lo] = text.split('/');
  return (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
}

/** Whether the LSN `text` ("16/B374D848") is at most `bound`, without a BigInt per call (it runs per WAL message). */
export function lsnAtMost(text: string, bound: bigint): boolean {
  const slash = text.indexOf('/');
  const hi = Number.parseInt(text.slice(0, slash), 16);
  const boundHi = Number(bound >> 32n);
  if (hi !== boundHi) return hi < boundHi;
  return Number.parseInt(text.slice(slash + 1), 16) <= Number(bound & 0xffffffffn);
}

/** The LSN text form back (for the standby status update). */
export function lsnText(lsn: bigint): string {
  return `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffffffffn).toString(16).toUpperCase()}`;
}

type Raw = Record<string, Uint8Array | null>;

const buf = (v: Uint8Array) => Buffer.from(v.buffer, v.byteOffset, v.byteLength);

function text(raw: Raw, name: string): string | null {
  const v = raw[name];
  return v ? buf(v).toString('utf8') : null;
}

function int8(raw: Raw, name: string): number | null {
  const v = raw[name];
  return v ? Number(buf(v).readBigInt64BE(0)) : null;
}

function int4(raw: Raw, name: string): number | null {
  const v = raw[name];
  return v ? buf(v).readInt32BE(0) : null;
}

function uuid(raw: Raw, name: string): string {
  const h = buf(raw[name]!).toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/**
 * An outbox insert, decoded from pgoutput's binary tuple (the `binary 'true'` option: each
 * column in its type's send format, so the payload arrives as its bytes and no text is parsed
 * but the headers). The same shape the polling claim returns, so the rest of the relay does
 * not know where a row came from. Columns are found by name: a column added by a later
 * migration does not move them.
 */
export function outboxRowOf(insert: Pgoutput.MessageInsert): ClaimedRow {
  const raw = insert.new as Raw;
  const headers = raw.headers;
  // jsonb's send format: a version byte (1), then the JSON text.
  const headersText = headers ? buf(headers).subarray(1).toString('utf8') : '{}';
  let parsedHeaders: unknown;
  try {
    parsedHeaders = JSON.parse(headersText);
  } catch {
    parsedHeaders = headersText; // not an object: wireHeaders parks the key, as for a polled row
  }
  const created = raw.created_at ? buf(raw.created_at).readBigInt64BE(0) : undefined;
  return {
    id: int8(raw, 'id')!,
    lane: int4(raw, 'lane')!,
    message_id: uuid(raw, 'message_id'),
    tenant_id: text(raw, 'tenant_id'),
    task_id: text(raw, 'task_id'),
    task_version: int8(raw, 'task_version'),
    task_seq: int4(raw, 'task_seq'),
    topic: text(raw, 'topic')!,
    key: text(raw, 'key')!,
    headers: parsedHeaders,
    // A copy: the chunk is a view into pg-protocol's read buffer, which the next socket read
    // overwrites when a message spans two reads (found by review: 30-45% of payloads under load).
    payload: raw.payload ? Buffer.from(buf(raw.payload)) : Buffer.alloc(0),
    // 'infinity' is int64 max: not finite, as the polled row's extract(epoch) would say.
    created_ms:
      created === undefined || created === 0x7fffffffffffffffn || created === -0x8000000000000000n
        ? Number.POSITIVE_INFINITY
        : Number(created / 1000n) + PG_EPOCH_MS,
  };
}

/** The prefix of the outbox's WAL messages (migration 0019's trigger): one per schema Cairn is installed in. */
export const messagePrefix = (schema: string) => `cairn.outbox:${schema}`;

/**
 * An outbox message written to the WAL (migration 0019): a 4-byte length n, the outbox's secret
 * (32 bytes), the row's columns as n bytes of JSON, then the payload's bytes. `id` is the relay's own (negative: never a table row's).
 * Content the outbox's trigger did not write (without the secret only the outbox's owner reads:
 * any role may call pg_logical_emit_message; or malformed) is no row: `{ refused }` says why.
 */
export function emittedRowOf(
  message: { b: Buffer; start: number; end: number },
  xid: number,
  id: number,
  secret: Buffer,
  walLsn: string,
): StreamRow | { refused: string } {
  // The content is read where it lies (bytes start to end of b): no view of it is made.
  const { b, start, end } = message;
  const size = end - start;
  const n = size >= 4 ? b.readInt32BE(start) : -1;
  const json = start + 4 + secret.length;
  if (n < 2 || json + n > end) return { refused: `${size} bytes with a header of ${n}` };
  // Compared before anything else is read (a loop: Buffer.compare's checks cost more for 32 bytes).
  for (let j = 0; j < secret.length; j++)
    if (b[start + 4 + j] !== secret[j]) return { refused: 'not written by the outbox' };
  let h = readHeader(b, json, json + n);
  if (h === undefined) {
    try {
      h = JSON.parse(b.toString('utf8', json, json + n)) as MessageHeader;
    } catch {
      return { refused: 'a header that is not JSON' };
    }
  }
  if (
    h === null ||
    typeof h !== 'object' ||
    typeof h.m !== 'string' ||
    typeof h.p !== 'string' ||
    typeof h.k !== 'string'
  ) {
    return { refused: 'no id, topic or key' };
  }
  const payload = Buffer.allocUnsafe(end - json - n);
  b.copy(payload, 0, json + n, end);
  return {
    id,
    lane: laneOf(h.k),
    message_id: h.m,
    tenant_id: h.t,
    task_id: h.i,
    task_version: h.v,
    task_seq: h.s,
    topic: h.p,
    key: h.k,
    headers: h.h,
    // A copy, for the same reason as a row's (outboxRowOf).
    payload,
    created_ms: h.c ?? Number.POSITIVE_INFINITY,
    xid,
    emitted: true,
    walLsn,
  };
}
