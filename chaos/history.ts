/**
 * One line of a run's history. Workers and the nemesis stamp every line with `now()`, a clock that
 * every process on this machine shares (time origin + monotonic offset), so lines of several
 * processes can be ordered against each other.
 */
export type HistoryEvent =
  /** A holder asks for `key`; it may wait up to `waitMs`. `kind`: which call (worker-calls.ts). */
  | { t: number; type: 'attempt'; holder: string; worker: string; key: string; waitMs: number; kind?: string }
  /**
   * The lock is held: its fencing token (absent on a backend without tokens), its deadline, and
   * the port of the Redis server the worker's lock connection is on (Sentinel: the master it found).
   */
  | {
      t: number;
      type: 'acquired';
      holder: string;
      worker: string;
      key: string;
      token?: number;
      deadline: number;
      server?: number;
      /** How long of the wait the process could not run (its timers fired late): CPU starvation. */
      stalledMs?: number;
      /** A shared (read) holder, or one of a semaphore's `permits`; absent: exclusive. */
      mode?: 'shared' | 'permits';
      permits?: number;
      /** The lease asked for (default: the run's ttl), whether the watchdog extends it (default true), minHold, maxHold. */
      ttl?: number;
      autoExtend?: boolean;
      minHold?: number;
      maxHold?: number;
    }
  /** A write of the register sent at `t` (before the answer), with the value read and the one written. */
  | {
      t: number;
      type: 'write';
      holder: string;
      worker: string;
      key: string;
      token?: number;
      read: number;
      wrote: number;
      accepted: boolean;
      seq?: number;
    }
  /** The holder's section ended; its release goes out next. */
  | { t: number; type: 'released'; holder: string; worker: string; key: string }
  /** The handle's signal aborted; `deadline` is the lease's last deadline. */
  | { t: number; type: 'lost'; holder: string; worker: string; key: string; reason: string; deadline: number }
  /** The attempt or the section failed with an error of this class. */
  | {
      t: number;
      type: 'error';
      holder: string;
      worker: string;
      key: string;
      error: string;
      message: string;
      stalledMs?: number;
      /** The section had begun: the error ended it (its 'released' came first), not the wait. */
      entered?: boolean;
    }
  /** What the store's own monitor reported (a Sentinel event: `+switch-master`, `+sdown`, ...). */
  | { t: number; type: 'store'; event: string; detail: string }
  /**
   * A failover of the store, as its monitor saw it, whoever caused it (the nemesis, or a frozen or
   * restarted master): from its start until the new master is announced. `server`: the old master.
   */
  | { t: number; type: 'failover'; phase: 'start' | 'end'; server: string }
  /** The nemesis starts or ends a fault; `target` is a worker, a server or 'network:<worker>'. */
  | { t: number; type: 'fault'; kind: FaultKind; phase: 'start' | 'end'; target: string };

export type FaultKind =
  | 'kill-worker'
  | 'pause-worker'
  | 'stall-event-loop'
  | 'restart-store-empty'
  | 'restart-store-snapshot'
  /** A crash and restart that keeps every acknowledged write (PostgreSQL recovering from its WAL). */
  | 'restart-store'
  /** Another transaction holds the lock table: statements on it queue behind. */
  | 'store-lock-stall'
  | 'store-sleep'
  | 'pause-store'
  | 'net-delay'
  | 'net-drop'
  | 'net-blackhole-up'
  | 'net-blackhole-down'
  /** Answers arrive after the request's deadline, and each request is applied a second time, later. */
  | 'net-late-replay'
  | 'clock-jump'
  | 'failover'
  /** A Redis Cluster master killed: its replica takes over, and it comes back as a replica. */
  | 'kill-master'
  /** A failover to a replica whose replication was cut for a while before. */
  | 'failover-lagging-replica';

/**
 * Faults after which the guarantees table allows two holders at once. A failover allows them too,
 * but the one the nemesis asks for may be refused, and a frozen or restarted master may cause
 * one: the checker takes failovers from what the store's monitor saw (`failover` events).
 */
export const OVERLAP_ALLOWED_AFTER: ReadonlySet<FaultKind> = new Set<FaultKind>([
  // A holder paused past its ttl (GC, stopped VM): the lease runs out under it.
  'pause-worker',
  'stall-event-loop',
  // The lock store forgot the lock: restarted without persistence or from an older snapshot.
  'restart-store-empty',
  'restart-store-snapshot',
  // A store server's wall clock jumped forward past the lease: it expired the lock early.
  'clock-jump',
]);

/**
 * Milliseconds on a clock every process of this machine shares: the monotonic clock (since boot).
 * Not `performance.timeOrigin + performance.now()`: each process takes its time origin from the
 * wall clock at start-up, and on a loaded machine two processes' origins differed by 15 ms, which
 * made a release and the next acquisition of two processes look like an overlap.
 */
export function now(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}
