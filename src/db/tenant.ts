import {
  CompiledQuery,
  type DatabaseConnection,
  type Dialect,
  type Driver,
  Kysely,
  PostgresAdapter,
  PostgresDriver,
  PostgresIntrospector,
  PostgresQueryCompiler,
  type TransactionSettings,
} from 'kysely';
import type pg from 'pg';
import { CairnError, ValidationError } from '../errors.js';
import type { Db } from './database.js';
import type { Executor } from './executor.js';
import type { Database } from './types.js';

export const TENANT_ID = /^[a-z0-9][a-z0-9_.-]{0,62}$/;

export function assertTenantId(tenantId: unknown, field = 'tenant_id'): string {
  if (typeof tenantId !== 'string' || !TENANT_ID.test(tenantId)) {
    throw new ValidationError('tenant id', [
      {
        path: field,
        message: "must be 1-63 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit",
        value: tenantId,
      },
    ]);
  }
  return tenantId;
}

/** Refuses a tenant id that is malformed or not registered (`cairn tenant add`), by name. */
export async function assertTenantKnown(db: Executor, tenantId: string, field = 'tenant'): Promise<void> {
  assertTenantId(tenantId, field);
  const t = await db
    .selectFrom('tenant')
    .select('tenant_id')
    .where('tenant_id', '=', tenantId)
    .executeTakeFirst();
  if (!t) {
    throw new CairnError(
      'unknown_tenant',
      `unknown tenant ${tenantId}: register it first with \`cairn tenant add ${tenantId}\``,
    );
  }
}

const setLocal = (tenant: string) =>
  CompiledQuery.raw("SELECT set_config('cairn.tenant_id', $1, true)", [tenant]);
const setSession = (tenant: string) =>
  CompiledQuery.raw("SELECT set_config('cairn.tenant_id', $1, false)", [tenant]);
const reset = CompiledQuery.raw('RESET cairn.tenant_id');

/**
 * A driver that acts for one tenant on a shared pool: every transaction starts with
 * SET LOCAL cairn.tenant_id (the setting row-level security reads), and a statement outside
 * a transaction runs with the same setting for as long as it holds the connection, reset on
 * release. The pool belongs to the parent database: destroying this one leaves it open.
 */
class TenantDriver implements Driver {
  constructor(
    private readonly inner: Driver,
    private readonly tenant: string,
  ) {}
  init() {
    return this.inner.init();
  }
  async acquireConnection(): Promise<DatabaseConnection> {
    const c = await this.inner.acquireConnection();
    try {
      await c.executeQuery(setSession(this.tenant));
    } catch (err) {
      await this.inner.releaseConnection(c);
      throw err;
    }
    return c;
  }
  async beginTransaction(c: DatabaseConnection, settings: TransactionSettings) {
    await this.inner.beginTransaction(c, settings);
    await c.executeQuery(setLocal(this.tenant));
  }
  commitTransaction(c: DatabaseConnection) {
    return this.inner.commitTransaction(c);
  }
  rollbackTransaction(c: DatabaseConnection) {
    return this.inner.rollbackTransaction(c);
  }
  async releaseConnection(c: DatabaseConnection) {
    await c.executeQuery(reset).catch(() => {}); // a dead connection is dropped by the pool anyway
    await this.inner.releaseConnection(c);
  }
  async destroy() {}
}

const pools = new WeakMap<Db, pg.Pool>();
const views = new WeakMap<Db, Map<string, Db>>();

/** Remembers the pool behind a database created by createDb (so tenant views can share it). */
export function registerPool(db: Db, pool: pg.Pool): void {
  pools.set(db, pool);
}

/**
 * The same database, acting for `tenantId`: hand it to createTaskStore, createOutbox and the
 * rest. Connect as the application role (`cairn_app`, created by the migrations): the owner
 * of the tables and superusers are not bound by row-level security.
 */
export function forTenant(db: Db, tenantId: string): Db {
  assertTenantId(tenantId);
  const pool = pools.get(db);
  if (!pool) throw new Error('forTenant needs a database made by createDb (its pool is shared)');
  let byTenant = views.get(db);
  if (!byTenant) {
    byTenant = new Map();
    views.set(db, byTenant);
  }
  let view = byTenant.get(tenantId);
  if (!view) {
    const dialect: Dialect = {
      createAdapter: () => new PostgresAdapter(),
      createDriver: () => new TenantDriver(new PostgresDriver({ pool }), tenantId),
      createIntrospector: (k) => new PostgresIntrospector(k),
      createQueryCompiler: () => new PostgresQueryCompiler(),
    };
    view = new Kysely<Database>({ dialect });
    byTenant.set(tenantId, view);
  }
  return view;
}
