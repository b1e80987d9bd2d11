/**
 * OpenTelemetry, when the application has it. `@opentelemetry/api` is an optional peer
 * dependency: without it every helper here is a no-op that allocates nothing, and with it but
 * no SDK registered the API's own no-op tracer gives invalid span contexts, which write no
 * header. Only the API is used: the application chooses the SDK, exporter and sampler.
 *
 * Span attributes carry identifiers (task id, version, status, topic, message id, key) and
 * error codes, never payloads, reasons or error messages: those may hold a tenant's data.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import type * as OtelApi from '@opentelemetry/api';
import { CairnError } from '../errors.js';

type Api = typeof OtelApi;
export type Span = OtelApi.Span;
export type Context = OtelApi.Context;
export type Link = OtelApi.Link;
export type SpanContext = OtelApi.SpanContext;

function load(): Api | undefined {
  try {
    return createRequire(import.meta.url)('@opentelemetry/api') as Api;
  } catch {
    return undefined; // not installed: tracing is off
  }
}

/** The API, or undefined when the application did not install it. */
export const otel: Api | undefined = load();

export const TRACER_NAME = '@cairn-state/cairn';

/** The package's version, from its package.json (two levels up in src/, three in dist/src/). */
function packageVersion(): string | undefined {
  for (const up of ['../../package.json', '../../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(up, import.meta.url), 'utf8')) as {
        name?: string;
        version?: string;
      };
      if (pkg.name === TRACER_NAME) return pkg.version;
    } catch {
      // not there: try the next level
    }
  }
  return undefined;
}

let version: string | undefined | null = null;

/** Cairn's tracer (asked of the global provider each time, so a provider registered later counts). */
export function tracer(api: Api): OtelApi.Tracer {
  if (version === null) version = packageVersion();
  return api.trace.getTracer(TRACER_NAME, version);
}

/** What the global provider delegates to while no SDK is registered: the API's no-op (a singleton). */
const noopProvider = otel ? new otel.ProxyTracerProvider().getDelegate() : undefined;

/**
 * True while no SDK is registered (or the API is absent): a span started now would be the
 * API's no-op, which records nothing and only carries its parent's span context. A per-message
 * caller may then skip the span when the parent is the active context anyway. Any provider
 * this cannot recognise counts as registered.
 */
export function noTracerRegistered(): boolean {
  if (!otel) return true;
  const p = otel.trace.getTracerProvider();
  return p instanceof otel.ProxyTracerProvider && p.getDelegate() === noopProvider;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** The W3C `traceparent` of a span context: `00-<trace id>-<span id>-<flags>`. */
export function formatTraceparent(sc: SpanContext): string {
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

/**
 * The trace headers of the active span context, or undefined when there is none (no API, no
 * SDK, or no span active): a message enqueued inside a span carries it to its consumers.
 */
export function activeTraceHeaders(): { traceparent: string; tracestate?: string } | undefined {
  if (!otel) return undefined;
  const sc = otel.trace.getSpanContext(otel.context.active());
  if (!sc || !otel.isSpanContextValid(sc)) return undefined;
  const tracestate = sc.traceState?.serialize();
  return { traceparent: formatTraceparent(sc), ...(tracestate ? { tracestate } : {}) };
}

/**
 * The remote span context a `traceparent` (and `tracestate`) names, or undefined when it is
 * absent or not a valid W3C traceparent (version ff, all-zero ids): such a header is ignored.
 */
export function spanContextFromHeaders(
  traceparent: string | undefined,
  tracestate: string | undefined,
): SpanContext | undefined {
  if (!otel || !traceparent) return undefined;
  const m = TRACEPARENT.exec(traceparent.trim());
  if (!m || m[1] === 'ff') return undefined;
  const sc: SpanContext = {
    traceId: m[2]!,
    spanId: m[3]!,
    traceFlags: Number.parseInt(m[4]!, 16) & 1,
    isRemote: true,
  };
  if (tracestate && typeof otel.createTraceState === 'function') {
    sc.traceState = otel.createTraceState(tracestate);
  }
  return otel.isSpanContextValid(sc) ? sc : undefined;
}

/** A context whose parent is the span a message's trace headers name, or undefined. */
export function contextFromHeaders(
  traceparent: string | undefined,
  tracestate: string | undefined,
): Context | undefined {
  const sc = spanContextFromHeaders(traceparent, tracestate);
  return sc && otel ? otel.trace.setSpanContext(otel.ROOT_CONTEXT, sc) : undefined;
}

/** `error.type` of a failure: a CairnError's stable code, never its message. */
export function errorType(err: unknown): string {
  return err instanceof CairnError ? err.code : '_OTHER';
}

export interface SpanOptions {
  kind?: 'internal' | 'producer' | 'consumer';
  attributes?: Record<string, string | number | boolean | undefined>;
  links?: Link[];
  /** The parent; the active context when omitted. */
  parent?: Context;
}

/**
 * Runs `fn` inside a new active span (so spans it starts, and messages it enqueues, are its
 * children) and ends the span when `fn` settles. A throw sets the span's status to error and
 * `error.type` to the error's code. Without the API, `fn` runs with no span at all.
 *
 * The SDK is the application's code: a sampler or span processor that throws, or a tracer that
 * never calls back, must not change what Cairn does. So the span is started with `startSpan`
 * (nothing of Cairn's runs inside the tracer), `fn` runs exactly once whatever the tracer did,
 * and every call on the span after that is guarded: an error in the tracer never replaces
 * `fn`'s result, and never turns a committed change into a reported failure.
 */
export async function withSpan<T>(
  name: string,
  options: SpanOptions,
  fn: (span?: Span) => Promise<T>,
): Promise<T> {
  const api = otel;
  if (!api) return fn(undefined);
  let span: Span | undefined;
  let ctx: Context | undefined;
  try {
    const kind =
      options.kind === 'producer'
        ? api.SpanKind.PRODUCER
        : options.kind === 'consumer'
          ? api.SpanKind.CONSUMER
          : api.SpanKind.INTERNAL;
    const attributes: OtelApi.Attributes = {};
    for (const [k, v] of Object.entries(options.attributes ?? {})) if (v !== undefined) attributes[k] = v;
    const parent = options.parent ?? api.context.active();
    span = tracer(api).startSpan(
      name,
      { kind, attributes, ...(options.links?.length ? { links: options.links } : {}) },
      parent,
    );
    ctx = api.trace.setSpan(parent, span);
  } catch {
    span = undefined; // the tracer failed: the work runs without a span
  }
  const guarded = (f: () => void) => {
    try {
      f();
    } catch {
      // the tracer's failure is not Cairn's: nothing to do
    }
  };
  // fn runs exactly once: in the span's context when the context manager calls it, or directly
  // when a broken one throws before calling it or never calls it.
  let ran = false;
  const call = () => {
    ran = true;
    return fn(span);
  };
  let result: Promise<T>;
  if (ctx) {
    const active = ctx;
    try {
      result = api.context.with(active, call);
    } catch (err) {
      if (ran) result = Promise.reject(err);
      else result = call();
    }
    if (!ran) result = call();
  } else {
    result = call();
  }
  try {
    return await result;
  } catch (err) {
    if (span) {
      const s = span;
      guarded(() => {
        s.setAttribute('error.type', errorType(err));
        s.setStatus({ code: api.SpanStatusCode.ERROR });
      });
    }
    throw err;
  } finally {
    if (span) {
      const s = span;
      guarded(() => s.end());
    }
  }
}
