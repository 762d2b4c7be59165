/** Polls `condition` until it is true; fails with `what` after `timeoutMs`. Never a blind sleep. */
export async function until(condition: () => boolean | Promise<boolean>, timeoutMs: number, what = 'condition'): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await condition()) return;
    if (Date.now() > deadline) throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Retries an assertion until it passes or the deadline passes (then its last error is thrown). */
export async function eventually(assertion: () => void | Promise<void>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await assertion();
      return;
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
}

/** Live timers of this process (Node's own count, including unref'd ones). */
export function activeTimers(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
}

/**
 * The emitter's next `event`. Not events.once(), which rejects on an 'error' meanwhile: a client
 * whose connection a test cuts emits one, and the test waits for what follows it.
 */
export function nextEvent(emitter: { once(event: string, listener: () => void): unknown }, event: string): Promise<void> {
  return new Promise((resolve) => emitter.once(event, () => resolve()));
}
