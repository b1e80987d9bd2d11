/**
 * Single observations a component emits for histograms (a latency, a batch size), which a
 * metrics registry built later subscribes to: like totalCounter's stats(), it keeps the
 * component free of metrics code. The emitter is found from the component's object through
 * a weak side table, so nothing is added to its public type.
 */
export interface Observations<E> {
  emit(event: E): void;
  /** Whether anything listens: a hot path builds its event only then. */
  readonly listening: boolean;
  subscribe(listener: (event: E) => void): void;
}

const owners = new WeakMap<object, Observations<unknown>>();

/** A new emitter; emit() costs a loop over no listeners until a registry subscribes. */
export function observations<E>(): Observations<E> {
  const listeners: Array<(event: E) => void> = [];
  return {
    emit(event) {
      for (const l of listeners) l(event);
    },
    subscribe(listener) {
      listeners.push(listener);
    },
    get listening() {
      return listeners.length > 0;
    },
  };
}

/** Records `emitter` as `owner`'s (a relay, a consumer) and returns `owner`. */
export function withObservations<T extends object, E>(owner: T, emitter: Observations<E>): T {
  owners.set(owner, emitter as Observations<unknown>);
  return owner;
}

/** The emitter of `owner`, if it has one. */
export function observationsOf<E>(owner: object): Observations<E> | undefined {
  return owners.get(owner) as Observations<E> | undefined;
}
