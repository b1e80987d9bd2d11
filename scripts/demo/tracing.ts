/**
 * The demo's OpenTelemetry: each of its processes registers an SDK that writes every finished
 * span as one JSON line to `<dir>/<process>.jsonl`, so one task's trace can be followed from
 * the orchestrator through the relay and every agent (the trace id travels in the messages'
 * `traceparent` header). A real deployment registers its own exporter instead (OTLP, Jaeger...).
 */
import { appendFileSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  BasicTracerProvider,
  type ReadableSpan,
  SimpleSpanProcessor,
  type SpanExporter,
} from '@opentelemetry/sdk-trace-base';

/** One finished span as the demo writes it. */
export interface SpanLine {
  traceId: string;
  spanId: string;
  parentSpanId: string | null;
  name: string;
  process: string;
  /** Trace ids of the spans it links to (a relay batch links to each message's origin). */
  links: string[];
  attributes: Record<string, unknown>;
}

/** Registers the demo's tracing in this process; spans go to `<dir>/<process>.jsonl`. */
export function startDemoTracing(dir: string, process: string): { shutdown(): Promise<void> } {
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${process.replace(/[^A-Za-z0-9_.-]/g, '_')}.jsonl`);
  const exporter: SpanExporter = {
    export(spans: ReadableSpan[], done) {
      const lines = spans.map((s) => {
        const line: SpanLine = {
          traceId: s.spanContext().traceId,
          spanId: s.spanContext().spanId,
          parentSpanId: s.parentSpanContext?.spanId ?? null,
          name: s.name,
          process,
          links: s.links.map((l) => l.context.traceId),
          attributes: s.attributes,
        };
        return `${JSON.stringify(line)}\n`;
      });
      appendFileSync(file, lines.join(''));
      done({ code: 0 });
    },
    async shutdown() {},
  };
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(provider);
  return { shutdown: () => provider.shutdown() };
}

/** Every span the demo's processes wrote to `dir`. */
export function readSpans(dir: string): SpanLine[] {
  let files: string[];
  try {
    files = readdirSync(dir).filter((f) => f.endsWith('.jsonl'));
  } catch {
    return [];
  }
  return files.flatMap((f) =>
    readFileSync(join(dir, f), 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as SpanLine),
  );
}
