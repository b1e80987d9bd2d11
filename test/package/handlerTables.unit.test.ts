import { describe, expect, it } from 'vitest';
import { createInboxConsumer, type InboxConsumerOptions } from '../../consumers/index.js';

type Orders = { orders: { id: string; total: number } };

/**
 * Type-level checks, enforced by `npm run typecheck` (which compiles the tests): a handler's
 * transaction is typed for the application's tables, and a table named like one of Cairn's
 * is refused (on Cairn's connections the unqualified name would find Cairn's table).
 */
function handlerTypes(options: Omit<InboxConsumerOptions, 'handler'>) {
  createInboxConsumer<Orders>({
    ...options,
    async handler(trx) {
      await trx.insertInto('orders').values({ id: 'o-1', total: 3 }).execute();
      // @ts-expect-error: a column the table does not have
      await trx.insertInto('orders').values({ id: 'o-1', totl: 3 }).execute();
      await trx.selectFrom('task_state').select('version').execute(); // Cairn's tables too
    },
  });
  // @ts-expect-error: the application's own `outbox` would be shadowed by Cairn's
  createInboxConsumer<{ outbox: { id: string } }>({ ...options, handler: async () => {} });
}

describe('inbox handler tables (checked by tsc; this only keeps the file in the suite)', () => {
  it('compiles', () => {
    expect(typeof handlerTypes).toBe('function');
  });
});
