import { html } from 'hono/html';
import type { DeadLetter } from '../consumers/deadLetters.js';
import type { ParkedKey } from '../src/outbox/operator.js';
import { STATUSES } from '../src/schemas/taskState.js';
import type { ActionResult } from './actions.js';
import type { ConsoleUser } from './auth.js';
import {
  type BusPage,
  type gatesPage,
  HUMANS_LIST_LIMIT,
  RETRY_OVERDUE_MINUTES,
  type TaskFilter,
  type TaskListRow,
  type taskPage,
} from './queries.js';

/**
 * Server-rendered pages. Every value goes through hono's `html` template, which escapes it:
 * task ids, reasons, error texts and patches are the tenant's or a broker's words, never markup.
 */
type Html = ReturnType<typeof html>;

/** What every page needs to draw its forms: who is looking, and their form token. */
export interface View {
  user: ConsoleUser;
  csrf: string;
  requestId: () => string;
}

/** A time as ISO 8601; '-' for none (and for -infinity, what a never-owned lane's lease ends at). */
function when(d: Date | string | number | null | undefined): string {
  const t = d === null || d === undefined ? Number.NaN : new Date(d).getTime();
  return Number.isFinite(t) ? new Date(t).toISOString() : '-';
}

export function layout(v: View, title: string, body: Html): Html {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${title} · Cairn console</title>
<link rel="stylesheet" href="/assets/console.css"><script src="/assets/console.js" defer></script></head>
<body><header><strong>Cairn console</strong>
<nav><a href="/tasks">Tasks</a> <a href="/bus">Bus</a> <a href="/humans">Humans in the loop</a></nav>
<span class="who">${v.user.name} (${v.user.role}${v.user.tenant ? `, tenant ${v.user.tenant}` : ', all tenants'})</span></header>
<section id="live" aria-label="live numbers">backlog <b data-live="backlog">-</b> · oldest <b data-live="oldest_seconds">-</b> s ·
published/s <b data-live="published_per_s">-</b> · applied/s <b data-live="applied_per_s">-</b></section>
<main><h1>${title}</h1>${body}</main></body></html>`;
}

/** A form that posts one action; read-only users see it disabled (the server refuses it anyway). */
function action(
  v: View,
  name: string,
  label: string,
  fields: Record<string, string>,
  opts: { reason?: boolean } = {},
): Html {
  const disabled = v.user.role !== 'operator' || (name === 'hold.release' && v.user.tenant !== undefined);
  return html`<form method="post" action="/actions/${name}" class="action">
<input type="hidden" name="request_id" value="${v.requestId()}"><input type="hidden" name="csrf" value="${v.csrf}">
${Object.entries(fields).map(([k, val]) => html`<input type="hidden" name="${k}" value="${val}">`)}
${opts.reason ? html`<input name="reason" placeholder="reason (audited)" required ${disabled ? 'disabled' : ''}>` : ''}
<button type="submit" data-action="${name}" ${disabled ? html`disabled title="read-only"` : ''}>${label}</button></form>`;
}

export function tasksPage(v: View, f: TaskFilter, rows: TaskListRow[]): Html {
  return layout(
    v,
    'Tasks',
    html`<form method="get" class="filters">
<label>status <select name="status"><option value="">any</option>
${STATUSES.map((s) => html`<option ${f.status === s ? 'selected' : ''}>${s}</option>`)}</select></label>
${v.user.tenant ? '' : html`<label>tenant <input name="tenant" value="${f.tenant ?? ''}"></label>`}
<label><input type="checkbox" name="quarantined" value="1" ${f.quarantined ? 'checked' : ''}> quarantined</label>
<label><input type="checkbox" name="held" value="1" ${f.held ? 'checked' : ''}> held</label>
<button>filter</button></form>
<table id="tasks"><tr><th>task</th><th>tenant</th><th>status</th><th>version</th><th>updated</th><th></th></tr>
${rows.map(
  (
    t,
  ) => html`<tr><td><a href="/tasks/${encodeURIComponent(t.task_id)}">${t.task_id}</a></td><td>${t.tenant_id}</td>
<td>${t.status}</td><td>${t.version}</td><td>${when(t.updated_at)}</td>
<td>${t.quarantined ? html`<span class="bad">quarantined</span>` : ''} ${t.held ? html`<span class="warn">held</span>` : ''}</td></tr>`,
)}</table>${rows.length === 0 ? html`<p>No tasks match.</p>` : ''}`,
  );
}

type TaskData = NonNullable<Awaited<ReturnType<typeof taskPage>>>;

export function taskDetailPage(v: View, d: TaskData): Html {
  const s = d.state;
  const active = d.quarantines.find((q) => q.released_at === null);
  const ownHold = d.holds.find((h) => h.taskId === s.task_id);
  return layout(
    v,
    `Task ${s.task_id}`,
    html`<p id="summary">tenant <b>${s.tenant_id}</b> · status <b id="status">${s.status}</b> · version <b>${s.version}</b> ·
updated ${when(s.updated_at)} by ${s.updated_by}</p>
${active ? html`<p class="bad">Quarantined since ${when(active.placed_at)} by ${active.placed_by}: ${active.reason}</p>${action(v, 'quarantine.release', 'Release quarantine', { task_id: s.task_id })}` : ''}
${d.holds.length ? html`<p class="warn">Legal hold: ${d.holds.map((h) => html`${h.taskId ? 'this task' : 'whole tenant'} (${h.reason}, by ${h.placedBy}) `)}</p>` : ''}
${ownHold ? action(v, 'hold.release', 'Release legal hold', { task_id: s.task_id }) : action(v, 'hold.place', 'Place legal hold', { task_id: s.task_id }, { reason: true })}
<h2>Gates</h2><ul class="gates">${Object.entries(s.gates).map(([g, ok]) => html`<li class="${ok ? 'ok' : 'open'}">${ok ? '✔' : '○'} ${g}</li>`)}</ul>
<h2>Budget</h2><p>${s.budget.currency_spent_usd} of ${s.budget.currency_committed_usd} USD · ${s.budget.tokens_spent} tokens · ${s.budget.hops_used} hops</p>
<h2>Timeline</h2><table id="timeline"><tr><th>version</th><th>when</th><th>who</th><th>from</th><th>reason</th><th>patch</th></tr>
${d.history.map(
  (
    h,
  ) => html`<tr><td>v${h.version}</td><td>${when(h.at)}</td><td>${h.actor}</td><td>${h.prev_version === null ? '-' : `v${h.prev_version}`}</td>
<td>${h.reason ?? ''}</td><td><code>${patchText(h.patch)}</code></td></tr>`,
)}</table>
<h2>Checkpoints</h2><table id="checkpoints"><tr><th>#</th><th>checkpoint</th><th>state version</th><th>when</th><th>reason</th><th>verification</th></tr>
${d.checkpoints.map(
  (
    c,
  ) => html`<tr><td>${c.seq}</td><td>${c.checkpoint_id}</td><td>v${c.state_version}</td><td>${when(c.created_at)}</td><td>${c.reason}</td>
<td class="${c.verdict === 'corrupt' ? 'bad' : c.verdict === 'ok' ? 'ok' : 'warn'}">${c.verdict}${c.problem ? `: ${c.problem}` : ''}</td></tr>`,
)}</table>${d.checkpoints.length === 0 ? html`<p>No checkpoints.</p>` : ''}
<h2>Pending work</h2>
<h3>Outbox</h3>${d.outbox.length === 0 ? html`<p>Nothing waits to be published.</p>` : ''}
<table>${d.outbox.map((o) => html`<tr><td>${o.message_id}</td><td>${o.topic}</td><td>v${o.task_version ?? '-'}</td><td>${when(o.created_at)}</td><td>${o.attempts} attempts</td><td>${o.last_error ?? ''}</td></tr>`)}</table>
<h3>Leases</h3><table>${d.leases.map((l) => html`<tr><td>${l.branch}</td><td>${l.holder ?? '(free)'}</td><td>fencing token ${l.fencing_token}</td><td>expires ${when(l.expires_at)}</td></tr>`)}</table>
<h3>Receipts</h3><table id="receipts"><tr><th>tool</th><th>step</th><th>status</th><th>attempt</th><th>worker</th><th>started</th><th>resolution</th></tr>
${d.receipts.map((r) => html`<tr><td>${r.tool}</td><td>${r.step}</td><td class="${r.status === 'gated' ? 'bad' : ''}">${r.status}</td><td>${r.attempt}</td><td>${r.worker}</td><td>${when(r.started_at)}</td><td>${r.resolution ?? ''}</td></tr>`)}</table>
${d.annotations.length ? html`<h3>Annotations</h3><ul>${d.annotations.map((a) => html`<li>${when(a.at)} ${a.author}: ${a.body}</li>`)}</ul>` : ''}`,
  );
}

/** A patch as `op path` pairs: the paths say what changed; values may be the tenant's data. */
function patchText(patch: unknown): string {
  // A row a tenant wrote by hand may hold anything: show what is not a patch as such, never fail the page.
  if (!Array.isArray(patch)) return `(not a JSON patch: ${JSON.stringify(patch)?.slice(0, 200)})`;
  return (patch as Array<{ op: string; path: string }>)
    .filter((p) => !['/version', '/updated_at', '/updated_by'].includes(p.path))
    .map((p) => `${p.op} ${p.path}`)
    .join(', ');
}

export function busPageView(v: View, b: BusPage): Html {
  return layout(
    v,
    'Bus',
    html`<h2>Outbox backlog per lane</h2><table id="lanes"><tr><th>lane</th><th>waiting</th><th>oldest (s)</th></tr>
${b.lanes.map((l) => html`<tr><td>${l.lane}</td><td>${l.backlog}</td><td>${l.oldest_seconds.toFixed(1)}</td></tr>`)}</table>
${b.lanes.length === 0 ? html`<p>The outbox is empty.</p>` : ''}
<h2>Lane owners</h2><table id="owners"><tr><th>relay</th><th>lanes</th><th>fencing tokens</th><th>lease until</th></tr>
${b.owners.map((o) => html`<tr><td>${o.owner ?? html`<i>no live owner</i>`}</td><td>${lanesText(o.lanes)}</td><td>${o.fencing_tokens}</td><td>${when(o.lease_until)}</td></tr>`)}</table>
<h2>Parked keys</h2>${b.parked.length === 0 ? html`<p>No key is parked.</p>` : ''}
<table id="parked"><tr><th>tenant</th><th>topic</th><th>key</th><th>behind it</th><th>parked</th><th>refusal</th><th></th></tr>${b.parked.map((p) => parkedRow(v, p))}</table>
<h2>Dead letters</h2>${b.deadLetters.length === 0 ? html`<p>No dead letters.</p>` : ''}
<table id="dead-letters"><tr><th>group</th><th>message</th><th>from</th><th>tries</th><th>when</th><th>error</th><th></th></tr>${b.deadLetters.map((d) => deadLetterRow(v, d))}</table>`,
  );
}

/** 0,1,2,5,7,8 as "0-2, 5, 7-8". */
function lanesText(lanes: number[]): string {
  const out: string[] = [];
  for (let i = 0; i < lanes.length; i++) {
    let j = i;
    while (j + 1 < lanes.length && lanes[j + 1] === lanes[j]! + 1) j++;
    out.push(j > i ? `${lanes[i]}-${lanes[j]}` : `${lanes[i]}`);
    i = j;
  }
  return out.join(', ');
}

function parkedRow(v: View, p: ParkedKey): Html {
  return html`<tr data-key="${p.key}"><td>${p.tenant || '(none)'}</td><td>${p.topic}</td><td>${p.key}</td><td>${p.waiting} waiting</td>
<td>since ${when(p.parked_at)}</td><td>${p.error}</td>
<td>${action(v, 'parked.release', 'Release', { topic: p.topic, key: p.key, tenant: p.tenant }, { reason: true })}
${action(v, 'outbox.skip', 'Skip head message', { message_id: p.message_id, tenant: p.tenant }, { reason: true })}</td></tr>`;
}

function deadLetterRow(v: View, d: DeadLetter): Html {
  return html`<tr data-message="${d.message_id}"><td>${d.consumer_group}</td><td>${d.message_id}</td><td>${d.topic}/${d.partition}@${d.offset}</td>
<td>${d.attempts} attempts</td><td>dead since ${when(d.dead_at)}</td><td>${d.error}</td>
<td>${action(v, 'deadletter.replay', 'Replay', { message_id: d.message_id, group: d.consumer_group, tenant: d.tenant_id ?? '' })}</td></tr>`;
}

type Gates = Awaited<ReturnType<typeof gatesPage>>;

/** Said above a list cut at HUMANS_LIST_LIMIT (the query reads one row more to know). */
const more = (rows: readonly unknown[]): Html | string =>
  rows.length > HUMANS_LIST_LIMIT
    ? html`<p class="bad">The oldest ${HUMANS_LIST_LIMIT} are shown; more wait.</p>`
    : '';

export function humansPage(v: View, g: Gates): Html {
  return layout(
    v,
    'Humans in the loop',
    html`<h2>Gated receipts</h2>${g.gated.length === 0 ? html`<p>No receipt waits for a decision.</p>` : ''}
${more(g.gated)}${g.gated.slice(0, HUMANS_LIST_LIMIT).map((r) => {
  const lease = g.leases.filter((l) => l.task_id === r.task_id);
  return html`<article class="gated" data-receipt="${r.receipt_id}"><h3>${r.tool} · step ${r.step} · task
<a href="/tasks/${encodeURIComponent(r.task_id)}">${r.task_id}</a></h3>
<p>Intent: run <b>${r.tool}</b> for step <b>${r.step}</b>${r.irreversible ? ' (irreversible)' : ''}. Last attempt #${r.attempt} by ${r.worker},
started ${when(r.started_at)}${r.error ? `, error: ${r.error.slice(0, 500)}` : ''}. Why gated: ${(r.resolution ?? 'the outcome is unknown').slice(0, 500)}.</p>
<p>Lease: the attempt held fencing token ${r.fencing_token ?? '-'} (${r.lease_id ?? 'no lease'});
now ${lease.map((l) => html`${l.branch}: ${l.holder ?? 'free'}, token ${l.fencing_token}, until ${when(l.expires_at)} `)}</p>
${action(v, 'receipt.resolve', 'It ran (mark succeeded)', { receipt_id: r.receipt_id, outcome: 'succeeded' }, { reason: true })}
${action(v, 'receipt.resolve', 'Compensated (it was undone)', { receipt_id: r.receipt_id, outcome: 'compensated' }, { reason: true })}
${action(v, 'receipt.resolve', 'It did not run', { receipt_id: r.receipt_id, outcome: 'failed' }, { reason: true })}</article>`;
})}
<h2>Uncertain, waiting for a retry</h2>${g.waiting.length === 0 ? html`<p>No receipt has waited more than ${RETRY_OVERDUE_MINUTES} minutes for its retry.</p>` : html`<p>A resume left these for their worker to run again with the same key (their tool declared idempotent); none has yet. If none will (the task cancelled, the workflow changed), resume the task without the declaration: they are gated here.</p>`}
${more(g.waiting)}<table id="waiting">${g.waiting.slice(0, HUMANS_LIST_LIMIT).map(
      (
        r,
      ) => html`<tr data-receipt="${r.receipt_id}"><td><a href="/tasks/${encodeURIComponent(r.task_id)}">${r.task_id}</a></td><td>${r.tool}</td><td>${r.step}</td>
<td>attempt #${r.attempt} by ${r.worker}</td><td>started ${when(r.started_at)}</td><td>${(r.resolution ?? '').slice(0, 500)}</td></tr>`,
    )}</table>
<h2>Quarantined tasks</h2>${g.quarantined.length === 0 ? html`<p>No task is quarantined.</p>` : ''}
<table id="quarantined">${g.quarantined.map(
      (
        q,
      ) => html`<tr><td><a href="/tasks/${encodeURIComponent(q.task_id)}">${q.task_id}</a></td><td>${q.tenant_id ?? ''}</td>
<td>since ${when(q.placed_at)} by ${q.placed_by}</td><td>${q.reason}</td><td>${action(v, 'quarantine.release', 'Release', { task_id: q.task_id })}</td></tr>`,
    )}</table>
<h2>Legal holds</h2>${g.holds.length === 0 ? html`<p>No active legal hold.</p>` : ''}
<table id="holds">${g.holds.map(
      (
        h,
      ) => html`<tr><td>${h.tenantId}</td><td>${h.taskId ?? '(whole tenant)'}</td><td>${h.reason}</td><td>${h.placedBy}</td><td>${when(h.placedAt)}</td>
<td>${h.taskId ? action(v, 'hold.release', 'Release', { task_id: h.taskId }) : ''}</td></tr>`,
    )}</table>`,
  );
}

export function resultPage(v: View, name: string, r: ActionResult, back: string): Html {
  const title = r.repeated
    ? 'Already submitted'
    : r.outcome === 'done'
      ? 'Done'
      : r.outcome === 'already'
        ? 'Nothing to do'
        : 'Refused';
  return layout(
    v,
    title,
    html`<p id="result" data-outcome="${r.outcome}">${name}: ${r.message}${r.repeated ? ' (this request was sent before; nothing ran again)' : ''}</p>
<p><a href="${back}">back</a></p>`,
  );
}

export function errorPage(v: View | undefined, status: number, message: string): Html {
  const body = html`<p id="error" data-status="${status}">${message}</p>`;
  return v ? layout(v, `Error ${status}`, body) : html`<!doctype html><title>Error ${status}</title>${body}`;
}
