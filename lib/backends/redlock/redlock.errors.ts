import { LockBackendError, withoutCommand } from '../../lock.errors.js';

/** One master that did not answer an operation, and why. */
export interface MasterFailure {
  /** host:port (or socket path) of the master. */
  master: string;
  error: Error;
}

/**
 * Too few masters answered for the outcome to be known: not "held by another owner" (that is a
 * `LockNotAcquiredError` after the wait), but "a quorum of masters is unreachable". Lock
 * acquisition keeps retrying until its wait ends, then throws this.
 */
export class RedlockQuorumError extends LockBackendError {
  constructor(
    readonly operation: 'acquire' | 'extend' | 'release' | 'inspect',
    readonly keys: readonly string[],
    readonly quorum: number,
    readonly masters: number,
    failures: readonly MasterFailure[],
  ) {
    super(
      'redlock',
      `no quorum for ${operation} of ${keys.join(', ')}: ${masters - failures.length} of ${masters} masters answered, ` +
        `${quorum} needed (${failures.map((f) => f.error.message).join('; ')}). ` +
        `Check that at least ${quorum} of the masters are running and reachable from this process.`,
      failures[0]?.error,
    );
    // Without the commands the clients attached (their arguments carry owner tokens).
    this.failures = failures.map((failure) => ({ master: failure.master, error: withoutCommand(failure.error) as Error }));
  }

  /** The masters that did not answer, and why. */
  readonly failures: readonly MasterFailure[];
}
