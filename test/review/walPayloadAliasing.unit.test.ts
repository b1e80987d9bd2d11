import { Parser } from 'pg-protocol/dist/parser.js';
import { describe, expect, it } from 'vitest';

// Review of relay/wal/walRows.ts: `payload: raw.payload ? buf(raw.payload) : ...` keeps "a view of
// the replication chunk, not a copy: each chunk is a buffer of its own". It is not: pg-protocol's
// CopyData chunk is `this.buffer.slice(...)` (buffer-reader.ts bytes()), a view of the parser's
// buffer, and the parser reuses that buffer when a message straddles two socket reads
// (parser.ts mergeBuffer: "move the relevant part to the beginning of the buffer instead of
// allocating a new buffer"). pg-logical-replication parses the pgoutput message from that chunk
// with subarray (binary-reader.js), so a buffered StreamRow's payload is overwritten by the
// bytes of a later socket read before the relay publishes it.

function copyData(body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head[0] = 0x64; // 'd' CopyData
  head.writeUInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
}

describe('review: WAL payloads are views of a buffer pg-protocol reuses', () => {
  it('a CopyData chunk received earlier keeps its bytes after the next socket read (fails now: overwritten)', () => {
    const parser = new Parser();
    const chunks: Buffer[] = [];
    const a = copyData(Buffer.from('w'.padEnd(25, '\0') + 'A'.repeat(1000))); // an XLogData, payload AAAA...
    const b = copyData(Buffer.from('w'.padEnd(25, '\0') + 'B'.repeat(100)));
    // One socket read: message a whole, and the first bytes of b; the next read: the rest of b.
    const read1 = Buffer.concat([a, b.subarray(0, 10)]);
    const read2 = Buffer.from(b.subarray(10));
    const onMessage = (m: unknown) => chunks.push((m as { chunk: Buffer }).chunk);
    parser.parse(read1, onMessage);
    const first = chunks[0]!;
    const before = Buffer.from(first); // a copy, for the comparison
    expect(first.subarray(25).toString()).toBe('A'.repeat(1000));
    parser.parse(read2, onMessage);
    expect(chunks).toHaveLength(2);
    // What a StreamRow buffered between the two reads would publish:
    expect(first.equals(before)).toBe(true);
  });
});
