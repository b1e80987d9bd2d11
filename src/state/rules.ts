import { InvalidTransitionError, ValidationError } from '../errors.js';
import { GATES, type GateName, type TaskState } from '../schemas/taskState.js';
import { canTransition, isTerminal, TRANSITIONS } from './transitions.js';

/**
 * The rules every write must pass, as a pure function of the state before and after.
 * Throws InvalidTransitionError or ValidationError naming the field, the value and the rule.
 */
export function assertChangeAllowed(
  prev: TaskState,
  next: TaskState,
  opts: { reason?: string | undefined; requiredGates: readonly GateName[] },
): void {
  if (isTerminal(prev.status)) {
    throw new InvalidTransitionError(
      `task ${prev.task_id} is ${prev.status} (terminal) and can never change again; start a new task instead`,
    );
  }
  if (!canTransition(prev.status, next.status)) {
    const allowed = TRANSITIONS[prev.status];
    throw new InvalidTransitionError(
      `status: task ${prev.task_id} cannot move from ${prev.status} to ${next.status}; ` +
        `declared transitions from ${prev.status}: ${allowed.join(', ') || '(none)'}`,
    );
  }

  const issues: Array<{ path: string; message: string; value?: unknown }> = [];
  for (const gate of GATES) {
    if (prev.gates[gate] && !next.gates[gate] && !opts.reason?.trim()) {
      issues.push({
        path: `gates.${gate}`,
        message: 'a gate flips back to false only with an explicit reason (pass `reason`)',
        value: false,
      });
    }
  }
  if (next.status === 'complete') {
    const missing = opts.requiredGates.filter((g) => !next.gates[g]);
    if (missing.length > 0) {
      issues.push({
        path: 'status',
        message: `complete requires the gates ${opts.requiredGates.join(', ')} to be true; false: ${missing.join(', ')}`,
        value: 'complete',
      });
    }
  }
  const b0 = prev.budget;
  const b1 = next.budget;
  for (const key of ['currency_spent_usd', 'tokens_spent', 'hops_used'] as const) {
    if (b1[key] < b0[key]) {
      issues.push({ path: `budget.${key}`, message: `never decreases (was ${b0[key]})`, value: b1[key] });
    }
  }
  if (b1.currency_spent_usd > b1.currency_committed_usd) {
    issues.push({
      path: 'budget.currency_spent_usd',
      message: `must not exceed currency_committed_usd (${b1.currency_committed_usd})`,
      value: b1.currency_spent_usd,
    });
  }
  if (issues.length > 0) throw new ValidationError(`change to task ${prev.task_id}`, issues);
}
