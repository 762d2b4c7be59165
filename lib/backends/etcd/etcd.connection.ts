import type { Etcd3, IKeyValue, IOptions, IRangeRequest, ITxnRequest, ITxnResponse, Watcher } from 'etcd3';
import { InvalidLockKeyError, InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { requirePeer } from '../../peer-require.cjs';
import { accessRefusal, type EtcdIdentity } from './etcd.access.js';
import { hostPolicies, noRetries, watchBackoff } from './etcd.host-policy.js';
import type { CheckedEtcdConnection, ResolvedEtcdOptions } from './etcd.options.js';
import { sentence } from '../backend-message.js';
import { InFlight } from '../in-flight.js';

type Etcd3Package = typeof import('etcd3');

/** Past this many leases in doubt (each goes when revoked), no lease is used twice any more: the set stays bounded. */
const MAX_DOUBTFUL = 10_000;

/** A call's gRPC options: its deadline, as an absolute time. */
interface CallOptions {
  deadline: number;
}

/** What an operation is for, as error messages name it. */
export interface Operation {
  op: string;
  keys: readonly string[];
}

/**
 * The etcd backend's client: the user's, left open, or one it creates (no retries of its own: the
 * service retries within its wait, and a retried transaction could apply twice) and closes on
 * shutdown. Every call carries the command timeout as its gRPC deadline; failures become a
 * LockBackendError that names the operation and the keys.
 */
export class EtcdConnection {
  readonly client: Etcd3;
  /** Called after each call etcd answered: it is reachable (see FailedReleases). */
  onAnswer: (() => void) | undefined;
  private readonly owned: boolean;
  /**
   * Whether a call may be sent more than once: a client passed in, or settings that retry. Then
   * even an answered call may have an earlier copy still on its way to a member.
   */
  private readonly mayRetry: boolean;
  /** Leases named by a request that went unanswered: it may still land, and put keys on them. */
  private readonly doubtful = new Set<string>();
  /** Revokes not yet answered, sent in the background too (revokeQuietly()). */
  private readonly revoking = new InFlight();
  private readonly identity: EtcdIdentity;
  private stopped = false;

  constructor(
    connection: CheckedEtcdConnection,
    private readonly options: ResolvedEtcdOptions,
    /** The backend's name, for errors. */
    private readonly backendName: string,
  ) {
    this.owned = connection.kind === 'config';
    this.mayRetry = connection.kind !== 'config' || connection.config.faultHandling?.global !== undefined;
    const username = connection.kind === 'config' ? connection.config.auth?.username : undefined;
    this.identity = { username, prefix: options.prefix };
    if (connection.kind === 'client') {
      this.client = connection.client;
    } else {
      const etcd3 = loadEtcd3();
      const config: IOptions = connection.config;
      this.client = new etcd3.Etcd3({
        dialTimeout: options.commandTimeout,
        ...config,
        faultHandling: {
          global: noRetries(),
          host: hostPolicies(etcd3.isRecoverableError),
          watchBackoff: watchBackoff(),
          ...config.faultHandling,
        },
      });
    }
  }

  get closed(): boolean {
    return this.stopped;
  }

  /** A new lease of `seconds`: its id, and the ttl etcd granted (its minimum when more than asked). */
  async grant(seconds: number, what: Operation): Promise<{ id: string; ttl: number }> {
    const response = await this.call(what, (options) => this.client.leaseClient.leaseGrant({ TTL: seconds }, options));
    return { id: response.ID, ttl: Number(response.TTL) };
  }

  /** Restarts a lease's ttl; false when it is gone (expired or revoked). */
  keepAlive(lease: string, what: Operation): Promise<boolean> {
    return this.call(what, async (options) => {
      const stream = await this.client.leaseClient.leaseKeepAlive(options);
      // One request and its answer per stream; an error after the answer (the stream's end
      // racing its deadline) has nobody left to tell.
      const answer = await new Promise<{ TTL: string }>((resolve, reject) => {
        stream.on('data', resolve);
        stream.on('error', reject);
        stream.write({ ID: lease });
      }).finally(() => stream.end());
      return Number(answer.TTL) > 0;
    });
  }

  /**
   * Whether a lease whose keys this process deleted holds nothing else for certain, and may serve
   * another lock: no request that named it can land any more. Not with a client that may send a
   * request twice, nor after a request that named it went unanswered.
   */
  reusable(lease: string): boolean {
    return !this.mayRetry && !this.doubtful.has(lease) && this.doubtful.size < MAX_DOUBTFUL;
  }

  /** Deletes a lease and every key on it; false when it was already gone. */
  revoke(lease: string, what: Operation): Promise<boolean> {
    // Counted until answered: close() waits for it, or closing the client would cut it off and
    // leave the lease (and anything on it) for its whole ttl.
    return this.revoking.track(this.sendRevoke(lease, what));
  }

  /** Resolves once every revoke sent so far is answered or timed out (each within commandTimeout). */
  revokesAnswered(): Promise<void> {
    return this.revoking.settled();
  }

  private sendRevoke(lease: string, what: Operation): Promise<boolean> {
    return this.call(what, (options) =>
      this.client.leaseClient.leaseRevoke({ ID: lease }, options).then(
        () => true,
        (error: unknown) => {
          if (leaseGone(error)) return false;
          throw error;
        },
      ),
    ).then(
      (revoked) => {
        // Gone: nothing can land on it any more.
        this.doubtful.delete(lease);
        return revoked;
      },
      (error: unknown) => {
        // Unanswered, it may still land, and take whatever is on the lease then.
        this.doubtful.add(lease);
        throw error;
      },
    );
  }

  /** Revokes in the background: the lease would run out anyway, this only frees it sooner. */
  revokeQuietly(lease: string, what: Operation): void {
    this.revoke(lease, { op: 'clean-up', keys: what.keys }).catch(() => undefined);
  }

  /** Seconds left of a lease (whole seconds, as etcd counts them); -1 when it is gone. */
  async timeToLive(lease: string, what: Operation): Promise<number> {
    const response = await this.call(what, (options) => this.client.leaseClient.leaseTimeToLive({ ID: lease }, options));
    return Number(response.TTL);
  }

  txn(request: ITxnRequest, what: Operation): Promise<ITxnResponse> {
    return this.call(what, (options) => this.client.kv.txn(request, options)).catch((error: unknown) => {
      for (const op of [...(request.success ?? []), ...(request.failure ?? [])]) {
        const lease = op.request_put?.lease;
        if (lease !== undefined && String(lease) !== '0') this.doubtful.add(String(lease));
      }
      throw error;
    });
  }

  /** The entries a range read finds. */
  async range(request: IRangeRequest, what: Operation): Promise<IKeyValue[]> {
    return (await this.call(what, (options) => this.client.kv.range(request, options))).kvs;
  }

  /** A watch on one key's changes (puts and deletions), from the current revision on. */
  watchChanges(key: Buffer): Watcher {
    return this.client.watch().key(key).watcher();
  }

  /** `key`'s value and create revision, or undefined when it is missing (a linearizable read). */
  async entry(key: Buffer): Promise<{ value: Buffer; createRevision: number } | undefined> {
    const response = await this.call({ op: 'watch', keys: [] }, (options) => this.client.kv.range({ key }, options));
    const kv = response.kvs[0];
    return kv ? { value: kv.value, createRevision: Number(kv.create_revision) } : undefined;
  }

  /** Whether `error` says a lease a request named is gone. */
  isLeaseGone(error: unknown): boolean {
    return error instanceof LockBackendError && leaseGone(error.cause);
  }

  /** Refuses calls from now on; false if it was already closed. */
  stop(): boolean {
    if (this.stopped) return false;
    this.stopped = true;
    return true;
  }

  /** Closes the client if the backend created it (after stop()). */
  closeClient(): void {
    if (this.owned) this.client.close();
  }

  closedError(op: string, keys: readonly string[]): LockBackendError {
    return new LockBackendError(
      this.backendName,
      `${op}${keys.length ? ` of ${keys.join(', ')}` : ''} failed: the backend is closed (the application shut down).`,
    );
  }

  private async call<T>({ op, keys }: Operation, send: (options: CallOptions) => Promise<T>): Promise<T> {
    if (this.stopped && op !== 'release' && op !== 'clean-up') throw this.closedError(op, keys);
    let answer: T;
    try {
      answer = await send({ deadline: Date.now() + this.options.commandTimeout });
    } catch (error) {
      if (error instanceof Error && /request is too large|larger than max/.test(error.message)) throw tooLarge(keys, error);
      if (error instanceof Error && /too many operations in txn request/.test(error.message)) throw tooMany(keys, error);
      throw this.failure(op, keys, error);
    }
    this.onAnswer?.();
    return answer;
  }

  private failure(op: string, keys: readonly string[], error: unknown): LockBackendError {
    const what = `${op}${keys.length ? ` of ${keys.join(', ')}` : ''} failed: `;
    const refusal = error instanceof Error ? accessRefusal(error.message, this.identity) : undefined;
    // Credentials or rights refused: no wait heals them, the caller is told at once.
    if (refusal) return new LockBackendError(this.backendName, what + refusal, error, { permanent: true });
    // By the message, not instanceof: a client the user passed may come from another copy of etcd3.
    const timedOut = error instanceof Error && /DEADLINE_EXCEEDED/.test(error.message);
    const message = timedOut
      ? `etcd did not answer within ${this.options.commandTimeout} ms (commandTimeout); is a member paused or cut off, ` +
        `or has the cluster lost its quorum?`
      : sentence(error instanceof Error ? error.message || String(error) : String(error)) +
        (error instanceof Error && /UNAVAILABLE/.test(error.message) ? ' Is the member down, or has the cluster lost its quorum?' : '');
    return new LockBackendError(this.backendName, what + message, error);
  }
}

/**
 * etcd3 is an optional peer, loaded at construction, so a missing package stops the application
 * at start-up with what to install, not at its first lock.
 */
function loadEtcd3(): Etcd3Package {
  try {
    return requirePeer('etcd3') as Etcd3Package;
  } catch (error) {
    throw new InvalidLockOptionsError(
      'connection',
      `EtcdLockBackend needs the 'etcd3' package to talk to etcd: npm install etcd3 ` +
        `(${error instanceof Error ? error.message : String(error)})`,
    );
  }
}

/**
 * etcd refused a request for its size: no retry can fix it, so it is the caller's mistake, told
 * at once (the keys themselves are not repeated: they are what is too long).
 */
function tooLarge(keys: readonly string[], cause: Error): InvalidLockKeyError {
  const characters = keys.reduce((sum, key) => sum + key.length, 0);
  return new InvalidLockKeyError(
    `EtcdLockBackend: ${keys.length === 1 ? 'this key' : `these ${keys.length} keys`} (${characters} characters) make a request ` +
      `larger than etcd takes (--max-request-bytes, 1.5 MiB by default; a request names each key up to nine times). ` +
      `Use shorter keys, and a maxKeyLength that refuses longer ones before they reach etcd.`,
    { cause },
  );
}

/**
 * etcd refused a transaction for its number of operations (--max-txn-ops): as for its size, no
 * retry can fix it. An acquisition takes up to three operations a key (the entry, who asks, the
 * line it checks), so at etcd's default of 128 a caller that waits names at most 42 keys at once,
 * one that does not wait 64.
 */
function tooMany(keys: readonly string[], cause: Error): InvalidLockKeyError {
  return new InvalidLockKeyError(
    `EtcdLockBackend: ${keys.length} keys in one call make a transaction of more operations than etcd takes ` +
      `(--max-txn-ops, 128 by default: up to 42 keys for a caller that waits, 64 for one that does not). ` +
      `Lock fewer keys at once, or raise --max-txn-ops on every etcd member.`,
    { cause },
  );
}

/** etcd's answer to a request that names a lease it no longer has (expired or revoked). */
function leaseGone(error: unknown): boolean {
  return error instanceof Error && /requested lease not found/.test(error.message);
}
