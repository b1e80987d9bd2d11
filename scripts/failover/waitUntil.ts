/** How the failover scenario waits for a condition, up to a deadline. */
export type WaitUntil = (what: string, check: () => Promise<boolean>, deadlineMs: number) => Promise<void>;

/**
 * Asks `check` until it holds. A check that throws (a connection slow to open on a machine busy
 * with other tests) is asked again; at the deadline its last error is named.
 */
export const waitUntil: WaitUntil = async (what, check, deadlineMs) => {
  const until = Date.now() + deadlineMs;
  let lastError: unknown;
  for (;;) {
    try {
      if (await check()) return;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() > until) {
      const why = lastError === undefined ? '' : ` (the last check failed: ${(lastError as Error).message})`;
      throw new Error(`failover: timed out after ${deadlineMs} ms waiting for ${what}${why}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
};
