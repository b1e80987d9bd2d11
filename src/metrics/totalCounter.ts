import { Counter, type Registry } from 'prom-client';

/**
 * A Prometheus counter that mirrors a running total a component keeps itself (its stats()),
 * read at scrape time: the component stays free of metrics code.
 */
export function totalCounter(
  registry: Registry,
  spec: { name: string; help: string; read: () => number; labels?: Record<string, string> },
): void {
  let reported = 0;
  new Counter({
    name: spec.name,
    help: spec.help,
    labelNames: Object.keys(spec.labels ?? {}),
    registers: [registry],
    collect() {
      const now = spec.read();
      this.inc(spec.labels ?? {}, now - reported);
      reported = now;
    },
  });
}
