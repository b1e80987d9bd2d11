import type { GateName, TaskStatus } from '../schemas/taskState.js';

/**
 * The TaskState machine as a table. migrations/0001_task_state.ts seeds the same table into
 * SQL (`task_transition`), so the database refuses what this refuses; a unit test checks
 * that the two agree.
 */
export const TRANSITIONS: Readonly<Record<TaskStatus, readonly TaskStatus[]>> = {
  planning: ['implementing', 'failed', 'cancelled', 'expired'],
  implementing: ['reviewing', 'planning', 'failed', 'cancelled', 'expired'],
  reviewing: ['testing', 'implementing', 'failed', 'cancelled', 'expired'],
  testing: ['complete', 'implementing', 'failed', 'cancelled', 'expired'],
  complete: [],
  failed: [],
  cancelled: [],
  expired: [],
};

export const TERMINAL: ReadonlySet<TaskStatus> = new Set(['complete', 'failed', 'cancelled', 'expired']);

/** Gates that must be true before a task may become `complete`, unless the store is told otherwise. */
export const DEFAULT_REQUIRED_GATES: readonly GateName[] = [
  'plan_approved',
  'implementation_complete',
  'review_passed',
  'tests_passing',
];

/** True for the statuses a task never leaves (`complete`, `cancelled`, `failed`). */
export function isTerminal(status: TaskStatus): boolean {
  return TERMINAL.has(status);
}

/** True when TRANSITIONS declares a move from `from` to `to`. */
export function canTransition(from: TaskStatus, to: TaskStatus): boolean {
  return from === to ? !isTerminal(from) : TRANSITIONS[from].includes(to);
}
