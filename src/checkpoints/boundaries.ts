import { GATES, type TaskState } from '../schemas/taskState.js';
import { isTerminal } from '../state/transitions.js';

/**
 * Whether a change crosses a semantic boundary worth a checkpoint, and which: a gate that
 * flips to true, artifacts that changed (validated by the schema on the way in), or a task
 * that ends. Other changes (an agent joining, budget ticking) take no checkpoint.
 */
export function boundaryOf(prev: TaskState, next: TaskState, reason?: string): string | undefined {
  const parts: string[] = [];
  const passed = GATES.filter((g) => next.gates[g] && !prev.gates[g]);
  if (passed.length > 0) parts.push(`gate passed: ${passed.join(', ')}`);
  const changed = (
    Object.keys({ ...prev.artifacts, ...next.artifacts }) as Array<keyof TaskState['artifacts']>
  ).filter((k) => JSON.stringify(prev.artifacts[k]) !== JSON.stringify(next.artifacts[k]));
  if (changed.length > 0) parts.push(`artifacts: ${changed.join(', ')}`);
  if (isTerminal(next.status) && !isTerminal(prev.status)) {
    parts.push(`task ${next.status}${reason ? `: ${reason}` : ''}`);
  }
  return parts.length > 0 ? parts.join('; ') : undefined;
}
