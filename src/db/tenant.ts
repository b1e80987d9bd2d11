import {
  type DatabaseConnection,
  type Dialect,
  type Driver,
  Kysely,
  PostgresAdapter,
  PostgresDriver,
  PostgresIntrospector,
  PostgresQueryCompiler,
  sql,
  type TransactionSettings,
} from 'kysely';
import { CairnError, ConfigurationError, ValidationError } from '../errors.js';
import type { Db } from './database.js';
import type { Executor } from './executor.js';
import { createPool, defaultSchema, type PoolSettings } from './pool.js';
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

/**
 * Locks the tenant's row until the transaction ends: what retention batches ('deleting': FOR
 * SHARE, several at once) and what must not run beside them ('holding': FOR NO KEY UPDATE, a
 * legal hold being placed, the tenant's keys shredded) order themselves on. No tenant's role can
 * lock this row (no UPDATE on it), unlike an advisory lock, which any role can hold. Owner only.
 */
export async function lockTenantRow(
  trx: Executor,
  tenantId: string,
  mode: 'deleting' | 'holding',
): Promise<void> {
  await (mode === 'deleting'
    ? sql`SELECT 1 FROM tenant WHERE tenant_id = ${tenantId} FOR SHARE`
    : sql`SELECT 1 FROM tenant WHERE tenant_id = ${tenantId} FOR NO KEY UPDATE`
  ).execute(trx);
}

/**
 * Registers a tenant and creates its login role (idempotent). Run as the owner or an
 * operator with CREATEROLE; returns the role's name. `cairn tenant add` does this too.
 */
export async function registerTenant(db: Executor, tenantId: string): Promise<string> {
  assertTenantId(tenantId);
  const { rows } = await sql<{ role: string }>`SELECT cairn_register_tenant(${tenantId}) AS role`.execute(db);
  return rows[0]!.role;
}

/** How a tenant's connections log in; by default the parent's server and database, as the tenant's role, no password. */
export interface TenantLogin {
  /** The tenant role's password (set one in production: `ALTER ROLE ... PASSWORD`). */
  password?: string;
  /** A whole connection string for the tenant's role, instead of the parent's with the role as user. */
  connectionString?: string;
  /** Connections in the tenant's pool (default: the parent's). */
  max?: number;
}

/**
 * A driver that acts for one tenant: its own pool, logged in as the tenant's role. Row-level
 * security keys on that login (session_user), which nothing said over the connection can
 * change, so no connection of this pool can ever act for another tenant, and no setting can
 * leak to another tenant's connection: they never share one. The role is looked up on first
 * use, so forTenant itself stays synchronous.
 */
class TenantDriver implements Driver {
  private inner: Driver | undefined;
  constructor(
    private readonly parent: Db,
    private readonly parentOptions: ParentSettings,
    private readonly tenant: string,
    private readonly login: TenantLogin,
  ) {}
  async init() {
    // Through a function: the tenant list itself is the owner's.
    const { rows } = await sql<{ role_name: string | null }>`
      SELECT cairn_tenant_role(${this.tenant}) AS role_name`.execute(this.parent);
    const row = rows[0];
    if (!row?.role_name) {
      throw new CairnError(
        'unknown_tenant',
        `tenant ${this.tenant} has no login role: register it first with \`cairn tenant add ${this.tenant}\` (or registerTenant())`,
      );
    }
    let url = this.login.connectionString;
    if (!url) {
      if (!this.parentOptions.connectionString) {
        throw new ConfigurationError(
          `forTenant(db, '${this.tenant}'): the database was made from a pg.Pool without a connection string, ` +
            "so Cairn cannot tell where the tenant's role logs in: pass forTenant(db, tenant, { connectionString })",
        );
      }
      const u = new URL(this.parentOptions.connectionString);
      u.username = row.role_name;
      u.password = this.login.password ?? '';
      url = u.toString();
    }
    const pool = createPool({
      ...this.parentOptions,
      connectionString: url,
      max: this.login.max ?? this.parentOptions.max,
    });
    this.inner = new PostgresDriver({ pool });
    await this.inner.init();
  }
  acquireConnection(): Promise<DatabaseConnection> {
    return this.inner!.acquireConnection();
  }
  beginTransaction(c: DatabaseConnection, settings: TransactionSettings) {
    return this.inner!.beginTransaction(c, settings);
  }
  commitTransaction(c: DatabaseConnection) {
    return this.inner!.commitTransaction(c);
  }
  rollbackTransaction(c: DatabaseConnection) {
    return this.inner!.rollbackTransaction(c);
  }
  releaseConnection(c: DatabaseConnection) {
    return this.inner!.releaseConnection(c);
  }
  async destroy() {
    await this.inner?.destroy();
  }
}

/** How the parent database connects; no connection string when it runs on a pool made without one. */
type ParentSettings = Omit<PoolSettings, 'connectionString'> & { connectionString?: string | undefined };

const settings = new WeakMap<Db, ParentSettings>();
const views = new WeakMap<Db, Map<string, Db>>();

/** Remembers how a database made by createDb connects (so tenant views can log in likewise). */
export function registerPool(db: Db, options: ParentSettings): void {
  settings.set(db, options);
}

/** The schema of Cairn's tables for a database made by createDb, or a tenant view of one. */
export function schemaOf(db: Db): string {
  const parent = parents.get(db);
  return (settings.get(db) ?? (parent && settings.get(parent)))?.schema ?? defaultSchema();
}

/** Whether `db` was made by createDb, or is a tenant view of one (not a transaction, not another Kysely). */
export function isCairnDb(db: unknown): boolean {
  return typeof db === 'object' && db !== null && (settings.has(db as Db) || parents.has(db as Db));
}

/** Each tenant view's parent database, and the tenant it acts for. */
const parents = new WeakMap<Db, Db>();
const tenants = new WeakMap<Db, string>();

/** The tenant a database made by forTenant acts for; undefined for any other. */
export function tenantOf(db: Db): string | undefined {
  return tenants.get(db);
}

/** Closes the tenant views of a database (createDb's destroy does this). */
export async function destroyTenantViews(db: Db): Promise<void> {
  const byTenant = views.get(db);
  views.delete(db);
  await Promise.all([...(byTenant?.values() ?? [])].map((v) => v.destroy()));
}

/**
 * The same database, acting for `tenantId`: hand it to createTaskStore, createOutbox and the
 * rest. Its connections log in as the tenant's role (created by `cairn tenant add` or
 * registerTenant), which owns nothing, so row-level security binds every statement to the
 * tenant, whatever the SQL says. One pool per tenant, closed with the parent database.
 */
export function forTenant(db: Db, tenantId: string, login: TenantLogin = {}): Db {
  assertTenantId(tenantId);
  const options = settings.get(db);
  if (!options) throw new ConfigurationError('forTenant needs a database made by createDb');
  let byTenant = views.get(db);
  if (!byTenant) {
    byTenant = new Map();
    views.set(db, byTenant);
  }
  let view = byTenant.get(tenantId);
  if (!view) {
    const dialect: Dialect = {
      createAdapter: () => new PostgresAdapter(),
      createDriver: () => new TenantDriver(db, options, tenantId, login),
      createIntrospector: (k) => new PostgresIntrospector(k),
      createQueryCompiler: () => new PostgresQueryCompiler(),
    };
    view = new Kysely<Database>({ dialect });
    byTenant.set(tenantId, view);
    parents.set(view, db);
    tenants.set(view, tenantId);
  }
  return view;
}
