import {
  type Lease,
  LeaseHeldError,
  type LeaseManager,
  type ReceiptStore,
  type TaskStore,
} from '../../src/index.js';
import { killPoint } from './killPoints.js';
import { actorOf, commitStep } from './steps.js';

export interface DeployInput {
  store: TaskStore;
  receipts: ReceiptStore;
  leases: LeaseManager;
  topic: string;
  /** The deploy API: `POST <url>/apply?op=<task>` with an `idempotency-key` header. */
  deployUrl: string;
  /** The deploy lease's time to live: a dead run's lease blocks the resume this long. */
  leaseMs: number;
  taskId: string;
  expectedVersion: number;
}

/** What the deploy left in the graph's state: its receipt, and whether this run called the API. */
export interface Deployment {
  receiptId: string;
  calledHere: boolean;
}

/**
 * The one irreversible step: under the task's deploy lease, the deploy API is called through a
 * tool receipt, then the task is completed (CAS, fenced by the same lease).
 *
 * The receipt's intent commits before the call. A run killed after the API answered leaves it
 * `started`; the resume, once the dead run's lease expired, finds it uncertain and, the deploy
 * API being idempotent by key, calls it again with the same idempotency key (onUncertain:
 * 'retry'), which the API answers without deploying twice. A run killed after the receipt said
 * `succeeded` leaves nothing to call: the resume reads the receipt and goes on.
 */
export async function deployStep(d: DeployInput): Promise<{ version: number; deployment: Deployment }> {
  return withDeployLease(d, async (lease) => {
    const r = await d.receipts.runOnce({
      taskId: d.taskId,
      step: 'deploy',
      tool: 'deployer',
      args: { task: d.taskId, env: 'example' },
      lease,
      irreversible: true,
      onUncertain: 'retry',
      idempotentTool: true,
      effect: async ({ idempotencyKey }) => {
        const res = await fetch(`${d.deployUrl}/apply?op=${encodeURIComponent(d.taskId)}`, {
          method: 'POST',
          headers: { 'idempotency-key': idempotencyKey },
        });
        if (!res.ok) throw new Error(`deploy API answered ${res.status}`);
        const body = (await res.json()) as unknown;
        killPoint('deploy:after-effect');
        return body;
      },
    });
    if (r.status !== 'succeeded') throw new Error(`deploy of ${d.taskId} is ${r.status}, not succeeded`);
    killPoint('deploy:after-receipt');
    const version = await commitStep({
      store: d.store,
      topic: d.topic,
      agent: 'deploy',
      taskId: d.taskId,
      expectedVersion: d.expectedVersion,
      summary: `deployed (receipt ${r.receiptId})`,
      lease,
    });
    return { version, deployment: { receiptId: r.receiptId, calledHere: r.ran } };
  });
}

/**
 * Runs `fn` under the deploy lease (renewed while it runs). A lease still held by a run that
 * was killed is waited out, until its expiry and a margin; a live holder past that is an error.
 */
async function withDeployLease<T>(d: DeployInput, fn: (lease: Lease) => Promise<T>): Promise<T> {
  const until = Date.now() + d.leaseMs + 30_000;
  for (;;) {
    try {
      return await d.leases.withLease(
        {
          taskId: d.taskId,
          branch: 'deploy',
          agentId: `${actorOf('deploy')}#${process.pid}`,
          ttlMs: d.leaseMs,
        },
        fn,
      );
    } catch (err) {
      if (!(err instanceof LeaseHeldError) || Date.now() > until) throw err;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}
