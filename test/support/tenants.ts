import { createDb, type Db } from '../../src/db/database.js';
import { forTenant, registerTenant } from '../../src/db/tenant.js';
import type { TestDatabase } from './testDatabase.js';

/**
 * Tenants A and B registered in `t` (each with its login role), and the database as each of
 * them: connections that log in as the tenant's role, bound by row-level security. `app` is
 * the application role itself (cairn_app), acting for no tenant.
 */
export async function twoTenants(t: TestDatabase, max = 2): Promise<{ app: Db; asA: Db; asB: Db }> {
  for (const tenant of ['tenant-a', 'tenant-b']) await registerTenant(t.db, tenant);
  const u = new URL(t.url);
  u.username = 'cairn_app';
  const app = createDb({ connectionString: u.toString(), max });
  return { app, asA: forTenant(app, 'tenant-a'), asB: forTenant(app, 'tenant-b') };
}
