import type { AddressInfo } from 'node:net';
import { serve } from '@hono/node-server';
import { type Context, Hono } from 'hono';
import { streamSSE } from 'hono/streaming';
import { createCheckpointer } from '../src/checkpoints/checkpoints.js';
import type { KeyRing } from '../src/checkpoints/signing.js';
import type { TenantKeys } from '../src/crypto/tenantKeys.js';
import type { Db } from '../src/db/database.js';
import { isRetriableSqlError } from '../src/db/sqlstate.js';
import { forTenant, type TenantLogin } from '../src/db/tenant.js';
import { CairnError, NotFoundError, ValidationError } from '../src/errors.js';
import { isKafkaConfigurationError, isPoisonError } from '../src/kafka/classifyError.js';
import type { Publisher } from '../src/kafka/publisher.js';
import type { Logger } from '../src/logger.js';
import { newRequestId, runAction } from './actions.js';
import { CONSOLE_CSS, CONSOLE_JS } from './assets.js';
import { authenticate, type ConsoleUser, formTokens } from './auth.js';
import {
  busPageView,
  errorPage,
  humansPage,
  resultPage,
  taskDetailPage,
  tasksPage,
  type View,
} from './pages.js';
import { busPage, gatesPage, listTasks, liveSampler, type Scope, taskPage } from './queries.js';

/** What the console needs: the database, its users, and optionally keys, a publisher, a logger. */
export interface ConsoleOptions {
  /** The owner's database (made from a connection string, so tenant-bound users can log in as their tenant). */
  db: Db;
  users: readonly ConsoleUser[];
  /** To check checkpoint signatures and read encrypted snapshots, as `cairn checkpoint verify` does. */
  checkpointKeys?: { keyRing?: KeyRing; keys?: TenantKeys };
  /**
   * Makes the publisher each dead-letter replay sends with (it is connected and closed by that
   * replay, so concurrent replays never share one); without it replay is refused, saying why.
   */
  publisher?: () => Publisher;
  /** How tenant-bound users' connections log in (see forTenant). */
  tenantLogin?: TenantLogin;
  /** How often the live numbers are pushed (default 2 s). */
  liveEveryMs?: number;
  logger?: Logger;
}

type Env = { Variables: { user: ConsoleUser; basic: boolean } };

/** The console as a fetch handler, to mount in a server of yours; close() ends its tenant connections. */
export interface ConsoleApp {
  /** Answers one request (a WHATWG fetch handler: Hono, Node's adapters, Bun and Deno take it). */
  fetch(request: Request): Response | Promise<Response>;
  /** Closes the connections it opened for tenant-bound users (not `db`, which is yours). */
  close(): Promise<void>;
}

/**
 * The operator console: server-rendered pages over the same library functions as the CLI.
 * Every request is authenticated (basic auth or a bearer token); `read` users see, `operator`
 * users also act; a user bound to a tenant reads through that tenant's row-level security.
 */
export function createConsoleApp(o: ConsoleOptions): ConsoleApp {
  const tokens = formTokens();
  const tenantDbs = new Map<string, Db>();
  const sample = liveSampler();
  const scopeOf = (user: ConsoleUser): Scope => {
    if (user.tenant === undefined) return { db: o.db, owner: o.db };
    let db = tenantDbs.get(user.tenant);
    if (!db) {
      db = forTenant(o.db, user.tenant, o.tenantLogin);
      tenantDbs.set(user.tenant, db);
    }
    return { db, owner: o.db, tenant: user.tenant };
  };
  const view = (c: Context<Env>): View => ({
    user: c.get('user'),
    csrf: tokens.of(c.get('user')),
    requestId: newRequestId,
  });

  const app = new Hono<Env>();
  app.get('/healthz', (c) => c.text('ok'));
  app.get('/assets/console.css', (c) =>
    c.body(CONSOLE_CSS, 200, { 'content-type': 'text/css; charset=utf-8' }),
  );
  app.get('/assets/console.js', (c) =>
    c.body(CONSOLE_JS, 200, { 'content-type': 'text/javascript; charset=utf-8' }),
  );

  app.use('*', async (c, next) => {
    c.header('content-security-policy', "default-src 'self'; frame-ancestors 'none'; form-action 'self'");
    c.header('x-content-type-options', 'nosniff');
    c.header('referrer-policy', 'same-origin');
    c.header('cache-control', 'no-store');
    if (c.req.path === '/healthz' || c.req.path.startsWith('/assets/')) return next();
    const who = authenticate(o.users, c.req.header('authorization'));
    if (!who) {
      c.header('www-authenticate', 'Basic realm="cairn console", charset="UTF-8"');
      return c.html(
        errorPage(undefined, 401, 'Sign in: basic auth or a bearer token (no anonymous access).'),
        401,
      );
    }
    c.set('user', who.user);
    c.set('basic', who.basic);
    return next();
  });

  app.onError((err, c) => {
    const user = c.get('user');
    const v = user ? view(c) : undefined;
    // Bad input is the request's fault; a stored row that fails validation on a page is not.
    if (err instanceof ValidationError && c.req.method === 'POST')
      return c.html(errorPage(v, 400, err.message), 400);
    if (err instanceof NotFoundError) return c.html(errorPage(v, 404, err.message), 404);
    const outage = outageOf(err);
    if (outage) {
      o.logger?.warn({ err, path: c.req.path }, `console: ${outage}`);
      return c.html(
        errorPage(v, 503, `${outage}: nothing was changed that is not shown; try again when it is back.`),
        503,
      );
    }
    if (err instanceof ValidationError) {
      o.logger?.error({ err, path: c.req.path }, 'console: stored data failed validation');
      return c.html(errorPage(v, 500, `Stored data failed validation: ${err.message}`), 500);
    }
    o.logger?.error({ err, path: c.req.path }, 'console request failed');
    return c.html(errorPage(v, 500, 'The request failed; the console log says why.'), 500);
  });

  app.get('/', (c) => c.redirect('/tasks'));
  app.get('/tasks', async (c) => {
    const q = c.req.query();
    const filter = {
      ...(q.status ? { status: q.status } : {}),
      ...(q.tenant ? { tenant: q.tenant } : {}),
      quarantined: q.quarantined === '1',
      held: q.held === '1',
    };
    return c.html(tasksPage(view(c), filter, await listTasks(scopeOf(c.get('user')), filter)));
  });
  app.get('/tasks/:id', async (c) => {
    const s = scopeOf(c.get('user'));
    const id = c.req.param('id');
    const data = await taskPage(s, id, createCheckpointer({ db: s.db, ...o.checkpointKeys }));
    // Another tenant's task is "not found", exactly like one that does not exist.
    if (!data) throw new NotFoundError('task', id);
    return c.html(taskDetailPage(view(c), data));
  });
  app.get('/bus', async (c) => c.html(busPageView(view(c), await busPage(scopeOf(c.get('user'))))));
  app.get('/humans', async (c) => c.html(humansPage(view(c), await gatesPage(scopeOf(c.get('user'))))));
  app.get('/api/live', async (c) => c.json(await sample(scopeOf(c.get('user')))));
  app.get('/live', (c) => {
    const s = scopeOf(c.get('user'));
    return streamSSE(c, async (stream) => {
      while (!stream.aborted && !stream.closed) {
        await stream.writeSSE({ event: 'numbers', data: JSON.stringify(await sample(s)) });
        await stream.sleep(o.liveEveryMs ?? 2000);
      }
    });
  });

  app.post('/actions/:name', async (c) => {
    const user = c.get('user');
    const v = view(c);
    if (user.role !== 'operator') {
      return c.html(errorPage(v, 403, `${user.name} is read-only: actions need the operator role`), 403);
    }
    const form = Object.fromEntries(
      Object.entries(await c.req.parseBody()).filter(([, value]) => typeof value === 'string'),
    ) as Record<string, string>;
    // A browser sends basic-auth credentials with a form another site makes it post: refuse a
    // cross-site request and one without this user's form token. Bearer tokens are never sent by themselves.
    if (
      c.get('basic') &&
      (c.req.header('sec-fetch-site') === 'cross-site' || !tokens.check(user, form.csrf))
    ) {
      return c.html(
        errorPage(v, 403, 'This form did not come from the console (missing or wrong form token).'),
        403,
      );
    }
    const name = c.req.param('name');
    const result = await runAction(
      { scope: scopeOf(user), user, ...(o.publisher ? { publisher: o.publisher } : {}) },
      name,
      form,
    );
    o.logger?.info(
      { actor: user.id, action: name, outcome: result.outcome, repeated: result.repeated },
      'console action',
    );
    const back = sameSiteBack(c.req.header('referer'), c.req.url);
    return c.html(resultPage(v, name, result, back), result.outcome === 'refused' ? 409 : 200);
  });

  return {
    fetch: (request) => app.fetch(request),
    async close() {
      // The tenant views are forTenant's, shared with the rest of the process and closed with
      // `db`: nothing of theirs to close here.
      tenantDbs.clear();
    },
  };
}

/** What is down, when an error is an outage (Postgres or the broker not answering) rather than a fault. */
function outageOf(err: unknown): string | undefined {
  if (isRetriableSqlError(err)) return 'Postgres is unavailable';
  if (err instanceof CairnError) return err.retriable ? err.message : undefined;
  const name = (err as { name?: unknown } | null)?.name;
  if (
    typeof name === 'string' &&
    name.startsWith('KafkaJS') &&
    !isPoisonError(err) &&
    !isKafkaConfigurationError(err)
  ) {
    return 'Kafka is unavailable';
  }
  return undefined;
}

/** Where "back" leads after an action: the page it came from, if it was one of ours (same origin, a plain path). */
function sameSiteBack(referer: string | undefined, requestUrl: string): string {
  if (!referer) return '/tasks';
  try {
    const u = new URL(referer);
    if (u.origin !== new URL(requestUrl).origin) return '/tasks';
    return /^\/(?![/\\])[^\\]*$/.test(u.pathname) ? `${u.pathname}${u.search}` : '/tasks';
  } catch {
    return '/tasks';
  }
}

/** A running console: its address, and how to stop it. */
export interface RunningConsole {
  url: string;
  /** Stops listening, ends open connections (live streams too) and the tenant connections. */
  close(): Promise<void>;
}

/** Starts the console on `host:port` (default 127.0.0.1, port 7070; 0 picks a free port). */
export async function startConsole(
  o: ConsoleOptions & { host?: string; port?: number },
): Promise<RunningConsole> {
  const app = createConsoleApp(o);
  const host = o.host ?? '127.0.0.1';
  const server = await new Promise<ReturnType<typeof serve>>((resolve, reject) => {
    const s = serve({ fetch: app.fetch, hostname: host, port: o.port ?? 7070 }, () => resolve(s));
    s.once('error', reject);
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${host.includes(':') ? `[${host}]` : host}:${port}`,
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        (server as unknown as { closeAllConnections?: () => void }).closeAllConnections?.();
      });
      await app.close();
    },
  };
}
