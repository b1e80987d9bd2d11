/**
 * CAS updates per second through the TaskStore against a raw `UPDATE ... SET version =
 * version + 1` with its audit row in one statement (since migration 0008 SQL refuses a
 * version raised without one), same table, same workers, same run. Also the
 * same CAS as the application role acting for a tenant (forTenant: row-level security on).
 * Each mode also reports CPU µs per update of Node, the database's backends and the broker
 * (which takes no part here: it should read near 0). And the same CAS with the changelog on
 * (issue 20: a second outbox row per update, the task's receipts read, two state digests).
 * And pgbench sending the very statements an update sends, with no Node (bench/pgbench.ts):
 * issue 16's target is CAS >= 0.9 x that; the raw UPDATE ratio stays beside it.
 */
import { sql } from 'kysely';
import { createDb } from '../src/db/database.js';
import { searchPath } from '../src/db/pool.js';
import { forTenant, registerTenant, schemaOf } from '../src/db/tenant.js';
import { createTaskStore, type TaskStore } from '../src/state/taskStore.js';
import { addCpu, type CpuSpent, cpuDuring, cpuLine, cpuPerMsg, cpuSources, NO_CPU } from './cpu.js';
import { captureStatements, findPgbench, pgbenchScript, reapedChildrenCpuS, runPgbench } from './pgbench.js';
import { benchDatabase, flag, throughput } from './support.js';

export async function benchCas(args: string[]): Promise<Record<string, unknown>> {
  const workers = flag(args, 'workers', 8);
  // Per mode, in two rounds of whole seconds (pgbench's -T takes whole seconds).
  const roundS = Math.max(1, Math.round(flag(args, 'seconds', args.includes('--quick') ? 3 : 10) / 2));
  const seconds = roundS * 2;
  const env = await benchDatabase('cas', workers + 2);
  const cpuSrc = await cpuSources(env);
  try {
    const store = createTaskStore({ db: env.db });
    // Each update in a statement of its own, as before the store coalesced concurrent ones.
    const aloneStore = createTaskStore({ db: env.db, coalesceUpdates: false });
    const aloneIds = Array.from({ length: workers }, (_, w) => `alone-${w}`);
    const actor = 'spiffe://bench.local/cas';
    const ids = Array.from({ length: workers }, (_, w) => `bench-${w}`);
    const rlsIds = Array.from({ length: workers }, (_, w) => `rls-${w}`);
    await registerTenant(env.db, 'bench'); // the tenant's login role, which forTenant logs in as
    const appUrl = new URL(env.url);
    appUrl.username = 'cairn_app';
    const appDb = createDb({ connectionString: appUrl.toString(), max: workers + 2 });
    const rlsStore = createTaskStore({ db: forTenant(appDb, 'bench') });
    const changelogStore = createTaskStore({ db: env.db, changelog: { topic: 'cairn.changelog.bench' } });
    const clIds = Array.from({ length: workers }, (_, w) => `changelog-${w}`);
    // The raw loop gets rows of its own in the same table: it bumps only the version column,
    // which would leave the store's rows with a document that disagrees with their version.
    const rawIds = Array.from({ length: workers }, (_, w) => `raw-${w}`);
    const versions = new Map<string, number>();
    const newTask = (id: string) => ({
      tenant_id: 'bench',
      task_id: id,
      workflow_digest: `sha256:${'0'.repeat(64)}`,
      intent_id: 'bench',
      budget: { currency_committed_usd: 1, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
    });
    for (const id of [...ids, ...aloneIds, ...rawIds, ...rlsIds, ...clIds]) {
      const t = await store.create({ task: newTask(id), actor });
      versions.set(id, t.version);
    }
    /**
     * The pgbench phase (bench/pgbench.ts): the statements one update of the store sends,
     * captured from a store whose clock is fixed, replayed by one pgbench process per worker
     * on a task of its own (fresh each round, so each starts at version 1). Null when there
     * is no pgbench.
     */
    const pgbenchPhase = async () => {
      const bin = findPgbench();
      if (!bin) return null;
      let now = new Date('2026-01-01T00:00:00.000Z');
      const fixed = createTaskStore({ db: env.db, clock: () => now, coalesceUpdates: false });
      const captureId = 'pgbench-capture';
      const created = await fixed.create({ task: newTask(captureId), actor });
      const createdAt = created.updated_at;
      now = new Date('2026-01-01T00:00:01.000Z');
      const sent = await captureStatements(async () => {
        const r = await fixed.update({
          taskId: captureId,
          expectedVersion: created.version,
          patch: { budget: { tokens_spent: 1 } },
          actor,
        });
        if (!r.ok) throw r.error;
      });
      const { script, mode, values } = pgbenchScript(sent, created.version);
      return {
        bin,
        mode,
        statements: sent.length,
        round: async (round: number) => {
          // The rows start where the captured update left its document: updated_at of `now`.
          const clientIds = Array.from({ length: workers }, (_, w) => `pgbench-${round}-${w}`);
          for (const id of clientIds) await fixed.create({ task: newTask(id), actor });
          const childBefore = await reapedChildrenCpuS();
          const m = await cpuDuring(
            cpuSrc,
            () =>
              runPgbench({
                bin,
                url: env.url,
                searchPath: searchPath(schemaOf(env.db)).replace(' ', ''),
                script,
                mode,
                seconds: roundS,
                clients: clientIds.map((id) => ({
                  version: created.version,
                  args: values((v) => (v === createdAt ? now.toISOString() : v.replaceAll(captureId, id))),
                })),
              }),
            { pollBackendsMs: 100 },
          );
          const childS = (await reapedChildrenCpuS()) - childBefore;
          // Every transaction pgbench counted must have raised its task's version by one.
          for (const [w, id] of clientIds.entries()) {
            // Read from the row: pgbench's document keeps the version it was captured with.
            const { rows } = await sql<{ version: number }>`
              SELECT version FROM task_state WHERE task_id = ${id}`.execute(env.db);
            const row = rows[0];
            if (row?.version !== created.version + m.result.perClient[w]!) {
              throw new Error(
                `pgbench's CAS on ${id} did not swap every time: version ${row?.version} after ${m.result.perClient[w]} transactions`,
              );
            }
          }
          spent.pgbench.ops += m.result.transactions;
          spent.pgbench.cpu = addCpu(spent.pgbench.cpu, { ...m.cpu, nodeS: m.cpu.nodeS + childS });
          return m.result.tps;
        },
      };
    };
    const pgbench = await pgbenchPhase();

    const tokens = new Map<string, number>([...ids, ...aloneIds, ...rlsIds, ...clIds].map((id) => [id, 0]));
    const casOn = (s: TaskStore, list: string[]) => async (w: number) => {
      const id = list[w]!;
      const r = await s.update({
        taskId: id,
        expectedVersion: versions.get(id)!,
        patch: { budget: { tokens_spent: tokens.get(id)! + 1 } },
        actor,
      });
      if (!r.ok) throw r.error;
      versions.set(id, r.state.version);
      tokens.set(id, r.state.budget.tokens_spent);
    };
    const cas = casOn(store, ids);
    const casAlone = casOn(aloneStore, aloneIds);
    const casRls = casOn(rlsStore, rlsIds);
    const casChangelog = casOn(changelogStore, clIds);
    // The floor of a versioned write: the version bump and its audit row in one statement,
    // with no Node work at all (a version raised without its audit row is refused by SQL).
    const raw = async (w: number) => {
      await sql`
        WITH u AS (UPDATE task_state SET version = version + 1 WHERE task_id = ${rawIds[w]!}
                   RETURNING task_id, tenant_id, version)
        INSERT INTO task_audit (task_id, version, prev_version, tenant_id, actor, patch)
        SELECT task_id, version, version - 1, tenant_id, 'bench', '[]' FROM u`.execute(env.db);
    };

    // Warm up both paths, then alternate rounds so drift (autovacuum, JIT) hits both alike.
    await throughput(workers, 1, cas);
    await throughput(workers, 1, casAlone);
    await throughput(workers, 1, casRls);
    await throughput(workers, 1, casChangelog);
    let casTotal = 0;
    let aloneTotal = 0;
    let rawTotal = 0;
    let rlsTotal = 0;
    let clTotal = 0;
    let pgbenchTotal = 0;
    const rounds = 2;
    // Each mode's CPU and operations, summed over the rounds.
    const spent = {
      raw: { ops: 0, cpu: NO_CPU },
      cas: { ops: 0, cpu: NO_CPU },
      cas_alone: { ops: 0, cpu: NO_CPU },
      cas_tenant_rls: { ops: 0, cpu: NO_CPU },
      cas_changelog: { ops: 0, cpu: NO_CPU },
      pgbench: { ops: 0, cpu: NO_CPU },
    };
    const measured = async (mode: keyof typeof spent, op: (w: number) => Promise<void>) => {
      const m = await cpuDuring(cpuSrc, () =>
        throughput(workers, roundS, async (w) => {
          await op(w);
          spent[mode].ops++;
        }),
      );
      spent[mode].cpu = addCpu(spent[mode].cpu, m.cpu);
      return { perS: m.result, cpu: m.cpu };
    };
    const nodeCores = (c: CpuSpent) => c.nodeS / roundS;
    let rawCpu = 0;
    let casCpu = 0;
    for (let i = 0; i < rounds; i++) {
      const r = await measured('raw', raw);
      rawTotal += r.perS;
      rawCpu += nodeCores(r.cpu);
      const c = await measured('cas', cas);
      casTotal += c.perS;
      casCpu += nodeCores(c.cpu);
      aloneTotal += (await measured('cas_alone', casAlone)).perS;
      rlsTotal += (await measured('cas_tenant_rls', casRls)).perS;
      clTotal += (await measured('cas_changelog', casChangelog)).perS;
      if (pgbench) pgbenchTotal += await pgbench.round(i);
    }
    const cpu = {
      raw: cpuPerMsg(spent.raw.cpu, spent.raw.ops),
      cas: cpuPerMsg(spent.cas.cpu, spent.cas.ops),
      cas_alone: cpuPerMsg(spent.cas_alone.cpu, spent.cas_alone.ops),
      cas_tenant_rls: cpuPerMsg(spent.cas_tenant_rls.cpu, spent.cas_tenant_rls.ops),
      cas_changelog: cpuPerMsg(spent.cas_changelog.cpu, spent.cas_changelog.ops),
      ...(pgbench ? { pgbench: cpuPerMsg(spent.pgbench.cpu, spent.pgbench.ops) } : {}),
    };
    await appDb.destroy();
    const rlsPerS = rlsTotal / rounds;
    console.log(
      `node CPU (cores busy): raw ${(rawCpu / rounds).toFixed(2)}, cas ${(casCpu / rounds).toFixed(2)}`,
    );
    const casPerS = casTotal / rounds;
    const rawPerS = rawTotal / rounds;
    const ratio = casPerS / rawPerS;
    const pgbenchPerS = pgbench ? pgbenchTotal / rounds : null;
    const toPgbench = pgbenchPerS ? casPerS / pgbenchPerS : null;
    const alonePerS = aloneTotal / rounds;
    const aloneToPgbench = pgbenchPerS ? alonePerS / pgbenchPerS : null;
    console.log(`workers: ${workers}, ${seconds} s per mode`);
    console.log(`CAS update (TaskStore.update, audit row, trigger): ${casPerS.toFixed(0)} /s`);
    console.log(`  ${cpuLine(cpu.cas, 'update')}`);
    console.log(
      `the same, each update in a statement of its own (coalesceUpdates: false): ${alonePerS.toFixed(0)} /s`,
    );
    console.log(`  ${cpuLine(cpu.cas_alone, 'update')}`);
    console.log(`raw version bump + audit row (one statement):     ${rawPerS.toFixed(0)} /s`);
    console.log(`  ${cpuLine(cpu.raw, 'update')}`);
    if (pgbench && pgbenchPerS) {
      console.log(`pgbench, the store's statements, no Node:          ${pgbenchPerS.toFixed(0)} /s`);
      console.log(`  ${cpuLine(cpu.pgbench!, 'update')} (Node here: the pgbench processes)`);
      console.log(`  statements per update: ${pgbench.statements}; ${pgbench.bin} -M ${pgbench.mode}`);
    } else {
      console.log('pgbench: not found (set CAIRN_PGBENCH), its phase was skipped');
    }
    console.log(
      `ratio to raw UPDATE: ${ratio.toFixed(2)}; ratio to pgbench: ${toPgbench?.toFixed(2) ?? 'n/a'} (target >= 0.9); ` +
        `each update alone to pgbench: ${aloneToPgbench?.toFixed(2) ?? 'n/a'}`,
    );
    console.log(
      `CAS as a tenant (forTenant: the tenant's login role, row-level security): ${rlsPerS.toFixed(0)} /s (${((rlsPerS / casPerS) * 100).toFixed(0)}% of the owner's)`,
    );
    console.log(`  ${cpuLine(cpu.cas_tenant_rls, 'update')}`);
    const clPerS = clTotal / rounds;
    console.log(
      `CAS with the changelog (a record per version in the outbox): ${clPerS.toFixed(0)} /s (${((clPerS / casPerS) * 100).toFixed(0)}% of without)`,
    );
    console.log(`  ${cpuLine(cpu.cas_changelog, 'update')}`);
    console.log(`CPU: ${cpuSrc.brokerSource}; ${cpuSrc.postgresSource}`);
    return {
      bench: 'cas',
      cas_per_s: Math.round(casPerS),
      raw_per_s: Math.round(rawPerS),
      ratio: Number(ratio.toFixed(3)),
      pgbench_per_s: pgbenchPerS === null ? null : Math.round(pgbenchPerS),
      cas_to_pgbench: toPgbench === null ? null : Number(toPgbench.toFixed(3)),
      cas_alone_per_s: Math.round(alonePerS),
      cas_alone_to_pgbench: aloneToPgbench === null ? null : Number(aloneToPgbench.toFixed(3)),
      pgbench_statements_per_update: pgbench?.statements ?? null,
      pgbench_protocol: pgbench?.mode ?? null,
      cas_tenant_rls_per_s: Math.round(rlsPerS),
      tenant_to_owner: Number((rlsPerS / casPerS).toFixed(3)),
      cas_changelog_per_s: Math.round(clPerS),
      changelog_to_without: Number((clPerS / casPerS).toFixed(3)),
      cpu_broker: cpuSrc.brokerSource,
      cpu_postgres: cpuSrc.postgresSource,
      cpu_by_phase: cpu,
    };
  } finally {
    await env.close();
  }
}
