/**
 * A named step where a test holds an actor (a hook calls `hold()`), waits until it got there
 * (`reached`), acts meanwhile, then lets it go on (`release()`, safe to call twice).
 */
export function pausePoint(): { hold(): Promise<void>; reached: Promise<void>; release(): void } {
  let arrived!: () => void;
  const reached = new Promise<void>((r) => {
    arrived = r;
  });
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  return {
    hold() {
      arrived();
      return released;
    },
    reached,
    release,
  };
}
