import { AsyncLocalStorage } from 'node:async_hooks';
import type { LockBackend } from './backends/lock-backend.interface.js';
import type { LockHandle } from './lock.handle.js';
import { processShared } from './process-shared.js';

/** The locks the current async context holds through one backend, by full key. */
export type HeldLocks = ReadonlyMap<string, LockHandle>;

/**
 * Holdings per backend: a key held through one backend says nothing about the same key in
 * another (an in-memory service and a Redis service in one process both name keys 'lock:...').
 * Never mutated: nested scopes copy.
 */
type Holdings = ReadonlyMap<LockBackend, HeldLocks>;

/**
 * The library's one AsyncLocalStorage. Scopes are entered with run() only: enterWith() would
 * leak a holder's context into code that runs after the scope ended.
 */
// One per process, shared by the ESM and CommonJS builds if both are loaded.
const storage = processShared('lock-context@2', () => new AsyncLocalStorage<Holdings>());

/** What the current async context holds through `backend`. */
export function heldLocks(backend: LockBackend): HeldLocks | undefined {
  return storage.getStore()?.get(backend);
}

/** Runs `fn` as a holder of the handle's keys, on the backend its leases live in. */
export function runHolding<T>(handle: LockHandle, fn: () => T): T {
  const backend = handle.leases[0].backend;
  const parent = storage.getStore();
  const held = new Map(parent?.get(backend));
  for (const key of handle.keys) held.set(key, handle);
  const holdings = new Map(parent);
  holdings.set(backend, held);
  return storage.run(holdings, fn);
}
