import type { TaskState } from '../schemas/taskState.js';
import { noTracerRegistered, otel, withSpan } from '../tracing/otel.js';
import type { TaskStore, UpdateInput, UpdateResult } from './taskStore.js';

/**
 * The store with each update() in a `cairn.task.update` span. The span is active while the
 * update runs, so the messages it enqueues carry it (their `traceparent`) to the relay and
 * the consumers. Attributes are identifiers only: the task id, the version made and the
 * status change, never the patch, the reason or an error's message.
 */
export function withUpdateSpans(store: TaskStore): TaskStore {
  if (!otel) return store;
  const update = store.update.bind(store);
  return {
    ...store,
    // Without an SDK the span would be the API's no-op, carrying the active context that the
    // update runs in anyway (its messages get the same traceparent): skipped, as the inbox
    // does (consumers/processSpan.ts), it saves a context, a span and their closures per update.
    update: (input: UpdateInput) =>
      noTracerRegistered()
        ? update(input)
        : withSpan(
            'cairn.task.update',
            {
              attributes: {
                'cairn.task.id': input.taskId,
                'cairn.task.expected_version': input.expectedVersion,
              },
            },
            async (span) => {
              const r: UpdateResult = await update(input);
              if (r.ok) span?.setAttribute('cairn.task.version', r.state.version);
              else span?.setAttribute('cairn.task.outcome', r.reason);
              return r;
            },
          ),
  };
}

/** Records a change's status on the update's span (the active one), once the change is known. */
export function noteStatusChange(prev: TaskState, next: TaskState): void {
  const span = otel?.trace.getActiveSpan();
  if (!span?.isRecording()) return;
  span.setAttributes({ 'cairn.task.status.from': prev.status, 'cairn.task.status.to': next.status });
}
