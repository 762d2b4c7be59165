import type { LockBackend } from '../lib/index.js';
import type { TcpProxy } from '../test/support/tcp-proxy.js';
import type { FaultKind, HistoryEvent } from './history.js';

/** What a fault on the store side needs: a random number and the run's ttl. */
export interface FaultContext {
  next: () => number;
  ttl: number;
}

/** A fault the store adapter injects: runs it to its end (healed) and returns what it hit. */
export type StoreFault = (context: FaultContext) => Promise<string>;

/**
 * A path from one worker to (part of) the store that the network faults hit: every proxy on it
 * gets the same mode at once. One link per server a worker may need alone (a Redlock master),
 * or one for the whole store (a master and the replica it may fail over to).
 */
export interface NetworkLink {
  name: string;
  proxies: readonly TcpProxy[];
}

/**
 * What a worker process builds its backend from: the store's name in the registry, options the
 * store's `createBackend` understands (JSON: it crosses a process boundary), and how many
 * application contexts the process runs over it (default one).
 */
export interface BackendSpec {
  store: string;
  options: unknown;
  contexts?: number;
}

/**
 * One backend under test, run in the harness's process: the servers it needs, what each worker
 * connects to (through proxies of the harness, for the network faults), and the faults the store
 * side can suffer. docs/reliability.md describes the contract.
 */
export interface ChaosStore {
  readonly name: string;
  /** Whether its locks carry fencing tokens. */
  readonly fencing: boolean;
  /** All workers in one process (several services of one in-memory backend). */
  readonly singleProcess: boolean;
  /** Longest a single backend call may take before it fails; part of a wait's bound. */
  readonly commandTimeout: number;
  /**
   * One election or session timeout of the store: after a fault heals, every key must be
   * acquirable again within the ttl plus this (docs/reliability.md states it per backend).
   */
  readonly recoveryMs: number;
  readonly faults: Partial<Record<FaultKind, StoreFault>>;
  start(): Promise<void>;
  backendFor(worker: string): Promise<BackendSpec>;
  /** The worker's network links to the store; none where the store is in-process. */
  links(worker: string): readonly NetworkLink[];
  /** Records what the store's own monitor reports (Sentinel's events) until stop(). */
  observe?(record: (event: HistoryEvent) => void): Promise<void>;
  stop(): Promise<void>;
}

/**
 * A store's module, as the registry loads it: the adapter class as its default export, and the
 * function a worker process calls to build a backend from `BackendSpec.options` (once per
 * application context). A backend with a line of waiters gets `waiterTimeout` (see
 * waiterTimeout() in chaos.worker.ts).
 */
export interface ChaosStoreModule {
  default: new () => ChaosStore;
  createBackend(options: unknown, waiterTimeout: number): LockBackend;
}
