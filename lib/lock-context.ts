import { AsyncLocalStorage } from 'node:async_hooks';
import type { LockHandle } from './lock.handle.js';
import { processShared } from './process-shared.js';

/** The locks the current async context holds, by full key. Never mutated: nested scopes copy. */
export type HeldLocks = ReadonlyMap<string, LockHandle>;

/**
 * The library's one AsyncLocalStorage. Scopes are entered with run() only: enterWith() would
 * leak a holder's context into code that runs after the scope ended.
 */
const storage = processShared('lock-context@1', () => new AsyncLocalStorage<HeldLocks>());

export function heldLocks(): HeldLocks | undefined {
  return storage.getStore();
}

export function runHolding<T>(handle: LockHandle, fn: () => T): T {
  const parent = storage.getStore();
  const held = new Map(parent);
  for (const key of handle.keys) held.set(key, handle);
  return storage.run(held, fn);
}
