import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { z } from 'zod';
import type { Db } from '../db/database.js';
import { LeaseHeldError, LeaseLostError } from '../errors.js';
import { type Logger, silentLogger } from '../logger.js';
import { opt, optionsSchema, parseOptions } from '../options.js';
import { acquireLease } from './sql/acquireLease.js';
import type { Fence } from './sql/fenceCheck.js';

export type { Fence };

/** A lease to take: the (task, branch) it covers, who takes it, and for how long. */
export interface LeaseRequest {
  taskId: string;
  branch: string;
  agentId: string;
  /** How long the lease lasts, in milliseconds, by the database's clock (at most 24 hours). */
  ttlMs: number;
}

/**
 * A lease held: its fence (pass it to writes as `fence`), its id, its holder and when it
 * expires by the database clock.
 */
export interface Lease extends Fence {
  leaseId: string;
  agentId: string;
  expiresAt: Date;
}

/** A lease taken, or `reason: 'lease_held'`: who holds it and until when (database time). */
export type AcquireResult =
  | ({ ok: true } & Lease)
  | { ok: false; reason: 'lease_held'; holder: string; expiresAt: Date };

/** The lease extended to `expiresAt`, or `reason: 'lease_lost'`: it expired, was taken over or released. */
export type RenewResult = { ok: true; expiresAt: Date } | { ok: false; reason: 'lease_lost' };

/** Takes, renews and releases task leases; expiry is judged by the database clock only. */
export interface LeaseManager {
  /**
   * Takes the lease if it is free or its holder's lease expired, raising the fencing token;
   * else says who holds it.
   */
  acquire(req: LeaseRequest): Promise<AcquireResult>;
  /** Extends a lease that is still held by `ttlMs` from now (database time). */
  renew(lease: Lease, ttlMs: number): Promise<RenewResult>;
  /** Gives the lease up at once (a no-op if it was already lost). */
  release(lease: Lease): Promise<void>;
  /**
   * Acquires, renews in the background at a third of the TTL, hands `fn` an AbortSignal
   * that fires when the lease is lost, and releases in `finally`. Throws LeaseHeldError if
   * someone else holds it.
   */
  withLease<T>(req: LeaseRequest, fn: (lease: Lease, signal: AbortSignal) => Promise<T>): Promise<T>;
}

const MAX_TTL_MS = 86_400_000;
/** Shorter than any real lease: a value this small is seconds passed where 0.3 takes milliseconds. */
const MIN_TTL_MS = 100;
const ttlMs = z
  .number()
  .int('must be a whole number of milliseconds')
  .min(
    MIN_TTL_MS,
    `must be at least ${MIN_TTL_MS} ms: leases take milliseconds since 0.3 (seconds before: multiply by 1000)`,
  )
  .max(MAX_TTL_MS, `must be at most ${MAX_TTL_MS} ms (24 h)`);
const TtlSchema = z.strictObject({ ttlMs });
const LeaseRequestSchema = optionsSchema<LeaseRequest>()(
  z.strictObject({ taskId: opt.text(), branch: opt.text(), agentId: opt.text(), ttlMs }),
);

/** What createLeaseManager takes. */
export interface LeaseManagerOptions {
  db: Db;
  logger?: Logger;
}

const LeaseManagerOptionsSchema = optionsSchema<LeaseManagerOptions>()(
  z.strictObject({ db: opt.db(), logger: opt.logger() }),
);

/**
 * Leases judge expiry by the database's clock only: an agent whose own clock is off cannot
 * extend, keep or steal a lease, since it never sends a time, only a duration.
 */
export function createLeaseManager(options: LeaseManagerOptions): LeaseManager {
  const { db, logger } = parseOptions('lease manager options', LeaseManagerOptionsSchema, options);
  const log = (logger ?? silentLogger).child({ component: 'leases' });
  const check = (req: LeaseRequest) => parseOptions('lease request', LeaseRequestSchema, req);

  const manager: LeaseManager = {
    async acquire(req) {
      check(req);
      const leaseId = randomUUID();
      const got = await acquireLease(db, {
        taskId: req.taskId,
        branch: req.branch,
        holder: req.agentId,
        leaseId,
        ttlMs: req.ttlMs,
      });
      if (got) {
        log.debug({ task_id: req.taskId, branch: req.branch, token: got.fencing_token }, 'lease acquired');
        return {
          ok: true,
          taskId: req.taskId,
          branch: req.branch,
          agentId: req.agentId,
          leaseId,
          fencingToken: got.fencing_token,
          expiresAt: got.expires_at,
        };
      }
      const held = await db
        .selectFrom('task_lease')
        .select(['holder', 'expires_at'])
        .where('task_id', '=', req.taskId)
        .where('branch', '=', req.branch)
        .executeTakeFirst();
      return {
        ok: false,
        reason: 'lease_held',
        holder: held?.holder ?? '(unknown)',
        expiresAt: held?.expires_at ?? new Date(0),
      };
    },

    async renew(lease, ttlMs) {
      parseOptions('lease renewal', TtlSchema, { ttlMs });
      const { rows } = await sql<{ expires_at: Date }>`
        UPDATE task_lease SET expires_at = now() + make_interval(secs => ${ttlMs / 1000})
         WHERE task_id = ${lease.taskId} AND branch = ${lease.branch} AND lease_id = ${lease.leaseId}::uuid
           AND holder IS NOT NULL AND expires_at > now()
        RETURNING expires_at
      `.execute(db);
      return rows[0] ? { ok: true, expiresAt: rows[0].expires_at } : { ok: false, reason: 'lease_lost' };
    },

    async release(lease) {
      await sql`
        UPDATE task_lease SET holder = NULL, expires_at = now()
         WHERE task_id = ${lease.taskId} AND branch = ${lease.branch} AND lease_id = ${lease.leaseId}::uuid
      `.execute(db);
    },

    async withLease(req, fn) {
      const got = await manager.acquire(req);
      if (!got.ok) throw new LeaseHeldError(got.holder, got.expiresAt, `lease ${req.taskId}/${req.branch}`);
      const { ok: _ok, ...lease } = got;
      const controller = new AbortController();
      const every = Math.max(50, req.ttlMs / 3);
      const timer = setInterval(async () => {
        try {
          const r = await manager.renew(lease, req.ttlMs);
          if (!r.ok) {
            clearInterval(timer);
            controller.abort(
              new LeaseLostError(`lease ${req.taskId}/${req.branch} (token ${lease.fencingToken}) was lost`),
            );
          }
        } catch (err) {
          log.warn({ task_id: req.taskId, err: (err as Error).message }, 'lease renewal failed; will retry');
        }
      }, every);
      try {
        return await fn(lease, controller.signal);
      } finally {
        clearInterval(timer);
        await manager.release(lease).catch(() => {});
      }
    },
  };
  return manager;
}
