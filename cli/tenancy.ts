import { parseArgs } from 'node:util';
import { localKeyring, writeKeyring } from '../src/crypto/keyProvider.js';
import { createTenantKeys } from '../src/crypto/tenantKeys.js';
import { annotate, listHolds, placeHold, releaseHold } from '../src/retention/holds.js';
import { runRetention, setRetentionPolicy } from '../src/retention/retention.js';
import { COMMAND_LOCKS, sayingWhoHolds } from './lockWait.js';
import { line, printResult, UsageError } from './output.js';
import { withDb } from './withDb.js';

const operator = `spiffe://cairn.local/operator/${process.env.USER ?? 'unknown'}`;
const usageError = (usage: string) => new UsageError(`\n${usage}`);

function keyringPath(value: string | undefined): string {
  const path = value ?? process.env.CAIRN_KEYRING;
  if (!path) throw new UsageError('name the keyring file: --keyring <file> or CAIRN_KEYRING');
  return path;
}

const keysUsage = `usage:
  cairn keys init --file F [--json]          a new keyring file (one key-encryption key; mode 600)
  cairn keys rotate --file F [--json]        add a new KEK and make it current (old ones stay, to unwrap)
  cairn keys rewrap [--keyring F] [--json]   rewrap every tenant data key under the current KEK`;

export async function keysCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { file: { type: 'string' }, keyring: { type: 'string' }, json: { type: 'boolean' } },
  });
  const [sub] = positionals;
  if ((sub === 'init' || sub === 'rotate') && values.file) {
    const file = values.file;
    const id = writeKeyring(file, { rotate: sub === 'rotate' });
    printResult(values.json, { file, current_kek_id: id }, () =>
      console.log(line`${file}: current key-encryption key ${id}`),
    );
    return 0;
  }
  if (sub === 'rewrap') {
    const provider = localKeyring(keyringPath(values.keyring ?? values.file));
    return withDb(async (db) => {
      const r = await createTenantKeys({ db, provider }).rewrapAll();
      printResult(values.json, r, () =>
        console.log(line`rewrapped ${r.rewrapped} data key(s) under ${r.kekId}; no payload was re-encrypted`),
      );
      return 0;
    });
  }
  throw usageError(keysUsage);
}

const tenantUsage = `usage:
  cairn tenant add <tenant> [--keyring F] [--json]          register a tenant and give it a data key
  cairn tenant shred <tenant> --yes [--keyring F] [--json]  delete its data keys: its ciphertext becomes unreadable`;

export async function tenantCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { keyring: { type: 'string' }, yes: { type: 'boolean' }, json: { type: 'boolean' } },
  });
  const [sub, tenant] = positionals;
  if (!tenant || (sub !== 'add' && sub !== 'shred')) throw usageError(tenantUsage);
  const provider = localKeyring(keyringPath(values.keyring));
  return withDb(async (db) => {
    const keys = createTenantKeys({ db, provider });
    if (sub === 'add') {
      const r = await sayingWhoHolds(
        db,
        { 'tenant registration': COMMAND_LOCKS['tenant registration'] },
        () => keys.addTenant(tenant),
        { json: values.json === true },
      );
      printResult(values.json, { tenant_id: tenant, ...r }, () =>
        console.log(
          line`${tenant}: ${r.created ? 'registered, data key' : 'already registered, data key'} ${r.keyId}`,
        ),
      );
      return 0;
    }
    if (!values.yes) throw new UsageError(`shredding cannot be undone: add --yes to shred ${tenant}`);
    const destroyed = await keys.shred(tenant);
    printResult(values.json, { tenant_id: tenant, destroyed }, () =>
      console.log(line`${tenant}: ${destroyed} data key(s) destroyed`),
    );
    return 0;
  });
}

const holdUsage = `usage:
  cairn hold place (--task T | --tenant X) --reason "..." [--actor spiffe://...] [--json]
  cairn hold release (--task T | --tenant X) [--actor spiffe://...] [--json]
  cairn hold list [--tenant X] [--all] [--json]`;

export async function holdCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      task: { type: 'string' },
      tenant: { type: 'string' },
      reason: { type: 'string' },
      actor: { type: 'string', default: operator },
      all: { type: 'boolean' },
      json: { type: 'boolean' },
    },
  });
  const [sub] = positionals;
  const target = {
    ...(values.task !== undefined ? { taskId: values.task } : {}),
    ...(values.tenant !== undefined ? { tenantId: values.tenant } : {}),
  };
  return withDb(async (db) => {
    if (sub === 'place') {
      const h = await placeHold(db, { ...target, reason: values.reason ?? '', actor: values.actor! });
      printResult(values.json, h, () =>
        console.log(
          line`${h.created ? 'hold' : 'already held:'} ${h.holdId} on ${h.taskId ? `task ${h.taskId}` : `tenant ${h.tenantId}`}: ${h.reason}`,
        ),
      );
      return 0;
    }
    if (sub === 'release') {
      const released = await releaseHold(db, { ...target, actor: values.actor! });
      printResult(values.json, { released }, () => console.log(line`released ${released} hold(s)`));
      return 0;
    }
    if (sub === 'list') {
      const holds = await listHolds(db, {
        ...(values.tenant ? { tenantId: values.tenant } : {}),
        all: !!values.all,
      });
      if (values.json) console.log(JSON.stringify(holds, null, 2));
      else if (holds.length === 0) console.log('no active holds');
      else
        for (const h of holds)
          console.log(
            line`${h.holdId}\t${h.tenantId}\t${h.taskId ?? '(whole tenant)'}\t${h.placedBy}\t${h.reason}`,
          );
      return 0;
    }
    throw usageError(holdUsage);
  });
}

export async function annotateCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      body: { type: 'string' },
      author: { type: 'string', default: operator },
      json: { type: 'boolean' },
    },
  });
  const [taskId] = positionals;
  if (!taskId) throw usageError('usage: cairn annotate <task> --body "..." [--author spiffe://...] [--json]');
  return withDb(async (db) => {
    const id = await annotate(db, { taskId, author: values.author!, body: values.body ?? '' });
    printResult(values.json, { annotation_id: id, task_id: taskId }, () =>
      console.log(line`annotation ${id} added to ${taskId}`),
    );
    return 0;
  });
}

const retentionUsage = `usage:
  cairn retention policy --tenant X --class public|internal|confidential --days N [--json]
  cairn retention run [--tenant X] [--batch 100] [--dry-run] [--actor spiffe://...] [--json]
  cairn retention certificates [--run ID] [--json]`;

export async function retentionCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      tenant: { type: 'string' },
      class: { type: 'string' },
      days: { type: 'string' },
      batch: { type: 'string', default: '100' },
      'dry-run': { type: 'boolean' },
      actor: { type: 'string', default: operator },
      run: { type: 'string' },
      json: { type: 'boolean' },
    },
  });
  const [sub] = positionals;
  return withDb(async (db) => {
    if (sub === 'policy' && values.tenant && values.class && values.days !== undefined) {
      await setRetentionPolicy(db, {
        tenantId: values.tenant,
        dataClass: values.class,
        retainDays: Number(values.days),
      });
      const policy = { tenant_id: values.tenant, data_class: values.class, retain_days: Number(values.days) };
      printResult(values.json, policy, () =>
        console.log(
          line`${values.tenant}: ${values.class} data kept ${values.days} day(s) after a task ends`,
        ),
      );
      return 0;
    }
    if (sub === 'run') {
      const r = await runRetention({
        db,
        actor: values.actor!,
        batchSize: Number(values.batch),
        dryRun: !!values['dry-run'],
        ...(values.tenant ? { tenantId: values.tenant } : {}),
      });
      if (values.json) console.log(JSON.stringify(r, null, 2));
      else {
        console.log(
          line`${r.dryRun ? 'would delete' : 'deleted'} ${r.tasks.length} task(s); ${r.held.length} expired but held; ` +
            `run ${r.runId}, ${r.certificates.length} certificate(s)`,
        );
        for (const [k, v] of Object.entries(r.totals)) console.log(line`  ${k.padEnd(12)} ${v}`);
        for (const f of r.failed) console.error(line`tenant ${f.tenantId}: not done: ${f.error}`);
      }
      // Another tenant's part of the run did not stop at this one's failure; the run is not done.
      return r.failed.length > 0 ? 1 : 0;
    }
    if (sub === 'certificates') {
      let q = db.selectFrom('deletion_certificate').selectAll().orderBy('issued_at');
      if (values.run) q = q.where('run_id', '=', values.run);
      const rows = await q.execute();
      if (values.json) console.log(JSON.stringify(rows, null, 2));
      else
        for (const c of rows)
          console.log(
            line`${c.certificate_id}\trun ${c.run_id}\t${c.tenant_id}\t${c.issued_at.toISOString()}\t${(c.body.tasks as unknown[]).length} task(s)\t${c.digest}`,
          );
      return 0;
    }
    throw usageError(retentionUsage);
  });
}
