/**
 * The promise's value, or undefined once `ms` have passed: for closing a connection or asking a
 * server something optional, where a store that does not answer must not hold the caller up.
 * The timer is cleared either way, so it keeps no process alive.
 */
export function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([promise, new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)))]).finally(() =>
    clearTimeout(timer),
  );
}
