import { MemoryLockBackend, type LockBackend } from '../../lib/index.js';
import type { BackendSpec, ChaosStore } from '../chaos-store.interface.js';

/** The in-memory backend: every service in one process, the only fault a stalled event loop. */
export default class MemoryStore implements ChaosStore {
  readonly name = 'memory';
  readonly fencing = true;
  readonly singleProcess = true;
  readonly commandTimeout = 0;
  /** Nothing to elect or reconnect: a stalled process frees its keys when its lease runs out. */
  readonly recoveryMs = 0;
  readonly faults = {};
  async start(): Promise<void> {}
  async backendFor(): Promise<BackendSpec> {
    return { store: this.name, options: {}, contexts: 5 };
  }
  links(): [] {
    return [];
  }
  async stop(): Promise<void> {}
}

let shared: MemoryLockBackend | undefined;

/** One backend for every application context of the process: they compete as services would. */
export function createBackend(): LockBackend {
  return (shared ??= new MemoryLockBackend());
}
