import { describe, expect, it } from 'vitest';
import { StaleWriteError } from '../../src/errors.js';
import { prepareMessage } from '../../src/outbox/message.js';
import {
  activeTraceHeaders,
  contextFromHeaders,
  errorType,
  formatTraceparent,
  otel,
  spanContextFromHeaders,
  withSpan,
} from '../../src/tracing/otel.js';

const ctx = { schemas: new Map(), maxPayloadBytes: 1024, defaultKey: 'k' };
const TRACE = '0af7651916cd43dd8448eb211c80319c';
const SPAN = 'b7ad6b7169203331';

describe('tracing without a registered SDK', () => {
  it('writes no trace header and runs the work unchanged (the no-op tracer gives invalid span contexts)', async () => {
    expect(otel).toBeDefined(); // the API is a dev dependency; no provider is registered here
    const seen = await withSpan('cairn.task.update', { attributes: { 'cairn.task.id': 't' } }, async () => {
      expect(activeTraceHeaders()).toBeUndefined();
      return prepareMessage({ topic: 'orders', payload: { a: 1 } }, 0, ctx);
    });
    expect(seen.headers).toEqual({});
    await expect(
      withSpan('failing', {}, async () => {
        throw new StaleWriteError('t', 1, 2);
      }),
    ).rejects.toBeInstanceOf(StaleWriteError);
  });

  it("keeps the caller's own traceparent", () => {
    const traceparent = `00-${TRACE}-${SPAN}-01`;
    expect(prepareMessage({ topic: 'orders', payload: 1, traceparent }, 0, ctx).headers).toEqual({
      traceparent,
    });
    expect(
      prepareMessage({ topic: 'orders', payload: 1, headers: { traceparent, tracestate: 'a=b' } }, 0, ctx)
        .headers,
    ).toEqual({ traceparent, tracestate: 'a=b' });
  });
});

describe('W3C traceparent', () => {
  it('parses and formats back', () => {
    const sc = spanContextFromHeaders(`00-${TRACE}-${SPAN}-01`, 'vendor=x');
    expect(sc).toMatchObject({ traceId: TRACE, spanId: SPAN, traceFlags: 1, isRemote: true });
    expect(sc?.traceState?.get('vendor')).toBe('x');
    expect(formatTraceparent(sc!)).toBe(`00-${TRACE}-${SPAN}-01`);
    expect(contextFromHeaders(`00-${TRACE}-${SPAN}-00`, undefined)).toBeDefined();
  });

  it('ignores what is not a valid traceparent', () => {
    for (const bad of [
      undefined,
      '',
      'garbage',
      `ff-${TRACE}-${SPAN}-01`,
      `00-${'0'.repeat(32)}-${SPAN}-01`,
      `00-${TRACE}-${'0'.repeat(16)}-01`,
      `00-${TRACE.toUpperCase()}-${SPAN}-01`,
    ]) {
      expect(spanContextFromHeaders(bad, undefined), String(bad)).toBeUndefined();
    }
  });

  it('names a failure by its code only, never its message', () => {
    expect(errorType(new StaleWriteError('tenant-secret-task', 1, 2))).toBe('stale_version');
    expect(errorType(new Error('tenant data'))).toBe('_OTHER');
  });
});
