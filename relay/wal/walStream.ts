import type { Pgoutput } from 'pg-logical-replication';
import { ConfigurationError, UnavailableError } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';
import { BinaryPgoutput, lsnTextOf, WalReplication } from './walReplication.js';
import { emittedRowOf, lsnOf, lsnText, messagePrefix, outboxRowOf, type StreamRow } from './walRows.js';

/**
 * The outbox's inserts as the WAL has them: a logical replication connection on the relay's
 * slot, decoded with pgoutput in binary form, buffered by whole transactions in commit order.
 * Outbox messages written to the WAL only (migration 0019) come the same way, in the same
 * order; for them the slot is the only copy (see relay/wal/walMode.ts).
 *
 * The slot is a fast feed, not the authority: a row leaves the outbox table only once the
 * broker acknowledged it (the relay's delete), so a row the stream skipped, or delivered to a
 * relay that then died, is still in the table for the relay's sweep. The slot is confirmed up
 * to a transaction once each of its rows was acknowledged or left in the table; on restart it
 * resends what follows (duplicates with the same message id, never a loss).
 */
export interface WalStream {
  /** Buffered rows of committed transactions, oldest first: up to `maxRows`, cut at `maxBytes` of payload (one row at least). */
  take(maxRows: number, maxBytes: number): StreamRow[];
  /** Resolves when rows arrive, the stream breaks, or after `ms`. */
  wait(ms: number): Promise<void>;
  /** Everything before `lsn` is published or in the table: the slot may drop it. */
  confirm(lsn: bigint): void;
  /** Nothing buffered or half-received: confirm up to what the server last said it had sent. */
  confirmIdle(): void;
  /** Why the stream ended (a lost connection, the server going away), or undefined while it runs. */
  readonly broken: Error | undefined;
  /** The position the slot was last confirmed to by this stream. */
  readonly confirmed: bigint;
  /** WAL messages under the outbox's prefix without its secret (not published). */
  readonly forged: number;
  stop(): Promise<void>;
}

function overflowMarker(xid: number): StreamRow {
  return {
    id: 0,
    lane: -1,
    message_id: '',
    tenant_id: null,
    task_id: null,
    task_version: null,
    task_seq: null,
    topic: '',
    key: '',
    headers: {},
    payload: Buffer.alloc(0),
    created_ms: 0,
    xid,
    overflow: true,
  };
}

/**
 * Buffered rows, or payload bytes, past which the connection is paused until the relay has
 * taken half. Four 2,500-row batches: rows waiting here are live objects each young-generation
 * collection copies (50,000 made the drain's GC 4.1 µs per message against 3.6, median of five
 * alternating drains of 100,000 WAL messages; the server sends faster than a relay publishes).
 */
const HIGH_WATER_ROWS = 10_000;
const HIGH_WATER_BYTES = 64 * 1024 * 1024;
/**
 * One transaction's rows are held until its commit arrives; past these, they are dropped from
 * memory and the relay reads that transaction from the table instead (a tenant's
 * `INSERT ... SELECT` of a million rows must not exhaust every relay, again at each restart).
 * A transaction's WAL messages have no other copy: they are never dropped. pgoutput sends a
 * transaction only once it committed, so past these they go to the relay before its commit
 * arrives (all but the last: the slot is confirmed past a transaction only at its commit).
 */
const MAX_OPEN_ROWS = 20_000;
const MAX_OPEN_BYTES = 32 * 1024 * 1024;
/** A standby status update at least this often, so wal_sender_timeout (60 s by default) never ends the stream. */
const STATUS_EVERY_MS = 10_000;

/**
 * Starts streaming the slot (which must exist: relay/wal/walSetup.ts) from its confirmed
 * position. Rejects when the server refuses (the slot held by another relay's connection, no
 * REPLICATION privilege, wal_level too low).
 */
export async function startWalStream(o: {
  connectionString: string;
  slot: string;
  publication: string;
  /** Only inserts into this table (Cairn's outbox, in this schema) are taken; any other table added to the publication is ignored. */
  schema: string;
  log: Logger;
  /** The slot's confirmed position as the server has it: reported from the start, so the server never times the stream out before the first confirm. */
  confirmedFlush?: bigint;
  /**
   * The secret the outbox's trigger writes into each WAL message (walSetup.ts reads it): a
   * message without it is not published. Undefined (this relay's role cannot read it): the
   * stream ends with a ConfigurationError at the first outbox message, confirming nothing past it.
   */
  messageSecret?: Buffer;
}): Promise<WalStream> {
  const prefix = Buffer.from(messagePrefix(o.schema));
  const plugin = new BinaryPgoutput(o.publication);
  const service = new WalReplication(
    { connectionString: o.connectionString, application_name: `cairn-relay-wal` },
    {
      xlog: (chunk) => {
        if (broken) return; // nothing after a failure is taken: the next stream reads it again
        try {
          if (chunk[25] === 0x4d) message(chunk, 25);
          else decoded(plugin.parse(chunk.subarray(25)));
        } catch (err) {
          // A message the decoding cannot read ends this stream (nothing past it confirmed), not the process.
          fail(err as Error);
        }
      },
      keepalive: (lsn, respond) => {
        keepalive = lsn;
        if (respond) sendStatus();
      },
    },
  );
  let ready: StreamRow[] = [];
  let head = 0;
  let open: StreamRow[] | undefined;
  let openXid = 0;
  let openBytes = 0;
  let openEmitted = false;
  let overflowed = false;
  let emittedIds = 0;
  let forged = 0;
  let forgedLogged = 0;
  let forgedLoggedAt = Number.NEGATIVE_INFINITY;
  let readyBytes = 0;
  let lastCommitEnd = 0n;
  let keepalive = 0n;
  let confirmed = o.confirmedFlush ?? 0n;
  let broken: Error | undefined;
  let paused = false;
  let wake: (() => void) | undefined;
  const signal = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  // The library keeps the socket's stream private; it pauses it the same way for its own flow control.
  const socket = () =>
    (service as unknown as { _connection?: { stream?: { pause?(): void; resume?(): void } } })._connection
      ?.stream;

  const sendStatus = () => {
    // The library sends the LSN it is given plus one; the slot's position is `confirmed` exactly.
    if (!broken && confirmed > 0n) void service.acknowledge(lsnText(confirmed - 1n)).catch(() => {});
  };
  const timer = setInterval(sendStatus, STATUS_EVERY_MS);
  timer.unref();

  /**
   * A logical message (pgoutput's 'M': flags, its LSN, a prefix ending in a zero byte, a length,
   * the content), read here rather than by the library's parser: the outbox's messages are most
   * of a WAL messages relay's stream, and only the prefix is compared before the content is.
   */
  function message(b: Buffer, at: number): void {
    const hi = b.readUInt32BE(at + 2);
    const lo = b.readUInt32BE(at + 6);
    const prefixAt = at + 10;
    const prefixEnd = b.indexOf(0, prefixAt);
    if (prefixEnd < 0)
      throw new UnavailableError('the WAL stream sent a logical message without the end of its prefix');
    if (
      !open ||
      prefixEnd - prefixAt !== prefix.length ||
      b.compare(prefix, 0, prefix.length, prefixAt, prefixEnd) !== 0
    )
      return;
    const start = prefixEnd + 5;
    const end = start + b.readInt32BE(prefixEnd + 1);
    if (end > b.length)
      throw new UnavailableError('the WAL stream sent a logical message shorter than its length');
    if (o.messageSecret === undefined) {
      fail(
        new ConfigurationError(
          "WAL relay: an outbox message arrived and this relay's role cannot read outbox_wal_secret to check it; " +
            "nothing past it is confirmed: run the relay as the outbox's owner (or GRANT SELECT ON outbox_wal_secret to its role)",
        ),
      );
      return;
    }
    const walLsn = hi === 0 && lo === 0 ? '' : lsnTextOf(hi, lo);
    const row = emittedRowOf({ b, start, end }, openXid, --emittedIds, o.messageSecret, walLsn);
    if ('refused' in row) {
      forged++;
      // Any role may write these (pg_logical_emit_message): a line per message was a tenant's
      // way to flood the relay's log. One line, then one per 10 s with the count since.
      const now = performance.now();
      if (now - forgedLoggedAt >= 10_000) {
        o.log.error(
          { xid: openXid, why: row.refused, forged_since_last_line: forged - forgedLogged },
          "a WAL message under the outbox's prefix that its trigger did not write: not published",
        );
        forgedLoggedAt = now;
        forgedLogged = forged;
      }
      return;
    }
    open.push(row);
    openBytes += row.payload.length;
    openEmitted = true;
    if (open.length > MAX_OPEN_ROWS || openBytes > MAX_OPEN_BYTES) tooLarge();
  }
  function decoded(m: Pgoutput.Message): void {
    switch (m.tag) {
      case 'begin':
        open = [];
        openXid = m.xid;
        openBytes = 0;
        openEmitted = false;
        overflowed = false;
        break;
      case 'insert':
        if (open && !overflowed && m.relation.name === 'outbox' && m.relation.schema === o.schema) {
          const row = { ...outboxRowOf(m), xid: openXid };
          open.push(row);
          openBytes += row.payload.length;
          if (open.length > MAX_OPEN_ROWS || openBytes > MAX_OPEN_BYTES) tooLarge();
        }
        break;
      case 'commit': {
        const end = lsnOf(m.commitEndLsn) ?? 0n;
        if (overflowed && open) {
          o.log.warn(
            { xid: openXid },
            'a transaction too large to buffer: the relay reads it from the table',
          );
          open.push(overflowMarker(openXid));
        }
        if (open && open.length > 0) {
          open[open.length - 1]!.endLsn = end;
          toReady(open);
        }
        open = undefined;
        lastCommitEnd = end;
        break;
      }
      default:
        break;
    }
  }
  /** Rows of committed transactions (all of them, or a large one's first part) for the relay. */
  function toReady(rows: readonly StreamRow[]): void {
    for (const r of rows) {
      ready.push(r);
      readyBytes += r.payload.length;
    }
    if (!paused && (ready.length - head > HIGH_WATER_ROWS || readyBytes > HIGH_WATER_BYTES)) {
      paused = true;
      socket()?.pause?.();
    }
    signal();
  }
  /**
   * The open transaction is past what is buffered: its table rows are dropped (the relay reads
   * them from the table), its WAL messages go to the relay now, all but the last.
   */
  function tooLarge(): void {
    if (!open) return;
    if (!overflowed && open.some((r) => !r.emitted)) overflowed = true; // its rows: from the table
    if (overflowed) open = open.filter((r) => r.emitted);
    if (openEmitted && open.length > 1) toReady(open.splice(0, open.length - 1));
    openBytes = open.reduce((n, r) => n + r.payload.length, 0);
  }

  const fail = (err: Error) => {
    if (broken) return;
    broken = err;
    o.log.warn({ err: err.message }, 'WAL stream ended; the relay reads the outbox table until it is back');
    signal();
  };
  service.on('error', fail);

  const started = new Promise<void>((resolve, reject) => {
    service.once('start', () => resolve());
    service.subscribe(plugin, o.slot).then(
      () => {
        // Ended before it started (the connection closed before the server answered
        // START_REPLICATION, which the library takes for a stop): the start fails, not hangs.
        const ended = new UnavailableError('the replication stream ended');
        reject(ended);
        fail(ended);
      },
      (err: Error) => {
        reject(err);
        fail(err);
      },
    );
  });
  try {
    await started;
  } catch (err) {
    clearInterval(timer);
    await service.destroy().catch(() => {});
    throw err;
  }

  return {
    take(maxRows, maxBytes) {
      const out: StreamRow[] = [];
      let bytes = 0;
      while (head < ready.length && out.length < maxRows) {
        const r = ready[head]!;
        if (out.length > 0 && bytes + r.payload.length > maxBytes) break;
        bytes += r.payload.length;
        readyBytes -= r.payload.length;
        out.push(r);
        head++;
      }
      if (head === ready.length) {
        ready = [];
        head = 0;
      } else if (head > 10_000) {
        ready = ready.slice(head);
        head = 0;
      }
      if (paused && ready.length - head < HIGH_WATER_ROWS / 2 && readyBytes < HIGH_WATER_BYTES / 2) {
        paused = false;
        socket()?.resume?.();
      }
      return out;
    },
    wait(ms) {
      if (head < ready.length || broken) return Promise.resolve();
      return new Promise((resolve) => {
        const t = setTimeout(() => {
          wake = undefined;
          resolve();
        }, ms);
        wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
    },
    confirm(lsn) {
      if (lsn <= confirmed) return;
      confirmed = lsn;
      sendStatus();
    },
    confirmIdle() {
      if (head < ready.length || open !== undefined) return;
      const upTo = keepalive > lastCommitEnd ? keepalive : lastCommitEnd;
      if (upTo > confirmed) {
        confirmed = upTo;
        sendStatus();
      }
    },
    get broken() {
      return broken;
    },
    get confirmed() {
      return confirmed;
    },
    get forged() {
      return forged;
    },
    async stop() {
      clearInterval(timer);
      broken ??= new UnavailableError('the replication stream was stopped');
      signal();
      await service.destroy().catch(() => {});
    },
  };
}
