import { AsyncLocalStorage } from 'node:async_hooks';
import { processShared } from './process-shared.js';

// One per process, shared by the ESM and CommonJS builds if both are loaded.
const storage = processShared('abort-scope@1', () => new AsyncLocalStorage<AbortSignal>());

/**
 * Runs `fn` so that every wait for a lock it starts, directly or in code it calls (`LockService`,
 * `@Locked`), gives up when `signal` aborts: the wait rejects with the signal's reason and leaves
 * the queue and the backend's line. Work that already holds its lock goes on; the signal only ends
 * waiting. LockInterceptor does this for every HTTP request, with a signal that aborts when the
 * client closes the connection; use it for other sources of cancellation (a message whose
 * consumer stopped, a job that was cancelled). Scopes nest: an inner wait gives up on either signal.
 */
export function withLockAbortSignal<T>(signal: AbortSignal, fn: () => T): T {
  const outer = storage.getStore();
  return storage.run(outer ? AbortSignal.any([outer, signal]) : signal, fn);
}

/** @internal The signal of the innermost scope, combined with the caller's own. */
export function scopedAbortSignal(own: AbortSignal | undefined): AbortSignal | undefined {
  const scoped = storage.getStore();
  if (!scoped) return own;
  return own && own !== scoped ? AbortSignal.any([scoped, own]) : scoped;
}
