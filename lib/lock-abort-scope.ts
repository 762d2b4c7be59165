import { AsyncLocalStorage } from 'node:async_hooks';
import { processShared } from './process-shared.js';

/** A scope's signal, or where to read it when a wait first needs it (see RequestAbort). */
type SignalSource = AbortSignal | { readonly signal: AbortSignal };

// One per process, shared by the ESM and CommonJS builds if both are loaded.
const storage = processShared('abort-scope@2', () => new AsyncLocalStorage<SignalSource>());

/**
 * Runs `fn` so that every wait for a lock it starts, directly or in code it calls (`LockService`,
 * `@Locked`), gives up when `signal` aborts: the wait rejects with the signal's reason and leaves
 * the queue and the backend's line. Work that already holds its lock goes on; the signal only ends
 * waiting. LockInterceptor does this for every HTTP request, with a signal that aborts when the
 * client closes the connection; use it for other sources of cancellation (a message whose
 * consumer stopped, a job that was cancelled). Scopes nest: an inner wait gives up on either signal.
 */
export function withLockAbortSignal<T>(signal: AbortSignal, fn: () => T): T {
  return withLockAbortSource(signal, fn);
}

/** @internal withLockAbortSignal with a signal read only when a wait needs it. */
export function withLockAbortSource<T>(source: SignalSource, fn: () => T): T {
  const outer = storage.getStore();
  return storage.run(outer ? combined(outer, source) : source, fn);
}

/** @internal The signal of the innermost scope, combined with the caller's own. */
export function scopedAbortSignal(own: AbortSignal | undefined): AbortSignal | undefined {
  const source = storage.getStore();
  if (!source) return own;
  const scoped = read(source);
  return own && own !== scoped ? AbortSignal.any([scoped, own]) : scoped;
}

function read(source: SignalSource): AbortSignal {
  return 'throwIfAborted' in source ? source : source.signal;
}

/** Both sources, read (and combined) when a wait first asks. */
function combined(outer: SignalSource, inner: SignalSource): SignalSource {
  let signal: AbortSignal | undefined;
  return {
    get signal() {
      return (signal ??= AbortSignal.any([read(outer), read(inner)]));
    },
  };
}
