import { LockBackendError, withoutCommand } from '../../lock.errors.js';
import { ACL_RULE_DOCS, isAclDenial } from '../redis/redis.acl.js';
import { refusalFix, refusalOf } from '../redis/redis.refusals.js';

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
    readonly operation: 'acquire' | 'extend' | 'release' | 'inspect' | 'verify',
    readonly keys: readonly string[],
    readonly quorum: number,
    readonly masters: number,
    failures: readonly MasterFailure[],
  ) {
    super(
      'redlock',
      `no quorum for ${operation}${keys.length ? ` of ${keys.join(', ')}` : ''}: ${masters - failures.length} of ${masters} masters answered, ` +
        `${quorum} needed (${failures.map((f) => f.error.message).join('; ')}). ` +
        advice(failures, quorum),
      failures[0]?.error,
      // Refused for good by more masters than the quorum can spare: waiting cannot make a quorum.
      { permanent: failures.filter((failure) => refusalOf(failure.error) !== undefined).length > masters - quorum },
    );
    // Without the commands the clients attached (their arguments carry owner tokens).
    this.failures = failures.map((failure) => ({ master: failure.master, error: withoutCommand(failure.error) as Error }));
  }

  /** The masters that did not answer, and why. */
  readonly failures: readonly MasterFailure[];
}

function advice(failures: readonly MasterFailure[], quorum: number): string {
  const refused = failures.filter((failure) => isAclDenial(failure.error)).length;
  const other = failures.map((failure) => refusalOf(failure.error)).find((refusal) => refusal && refusal !== 'rights');
  if (refused === 0 && other) return refusalFix(other, 'A master');
  if (refused === 0) return `Check that at least ${quorum} of the masters are running and reachable from this process.`;
  return (
    `${refused} of them refused it by the Redis user's ACL: the user needs EVALSHA, EVAL and the commands of the lock scripts ` +
    `on the lock keys, and PUBLISH to the release channels, on every master. ${ACL_RULE_DOCS}.`
  );
}
