import pg from 'pg';
import type { Logger } from '../src/logger.js';
import { OUTBOX_CHANNEL } from '../src/outbox/outbox.js';

/**
 * The relay's idle sleep, cut short by stop() or by a NOTIFY on the outbox channel
 * (`wakeOnNotify`). A notification that arrives while a batch runs is remembered, so the next
 * sleep is skipped. The LISTEN connection comes back by itself after an error (polling meanwhile).
 */
export function createWakeup(o: { log: Logger; stopping: () => boolean }) {
  let wake: (() => void) | undefined;
  let woken = false;
  let listener: pg.Client | undefined;

  async function listen(connectionString: string): Promise<void> {
    const client = new pg.Client({ connectionString, application_name: 'cairn-relay-listen' });
    client.on('notification', () => {
      if (wake) wake();
      else woken = true;
    });
    client.on('error', (err) => {
      o.log.warn({ err: err.message }, 'LISTEN connection lost; polling until it is back');
      listener = undefined;
      setTimeout(() => {
        if (!o.stopping()) void listen(connectionString).catch(() => {});
      }, 1000).unref();
    });
    await client.connect();
    await client.query(`LISTEN ${OUTBOX_CHANNEL}`);
    listener = client;
  }

  return {
    sleep(ms: number): Promise<void> {
      if (woken) {
        woken = false;
        return Promise.resolve();
      }
      return new Promise((resolve) => {
        const t = setTimeout(resolve, ms);
        wake = () => {
          clearTimeout(t);
          wake = undefined;
          resolve();
        };
      });
    },
    /** Ends the current sleep (stop()). */
    wake: () => wake?.(),
    listen,
    /** Closes the LISTEN connection, if any. */
    end: async () => {
      await listener?.end().catch(() => {});
    },
  };
}
