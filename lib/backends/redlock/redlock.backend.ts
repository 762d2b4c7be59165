import { inspect } from 'node:util';
import { Logger } from '@nestjs/common';
import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { InvalidLockOptionsError, LockBackendError } from '../../lock.errors.js';
import { refusalOf } from '../redis/redis.refusals.js';
import type { BackendHealth, ExtendResult, LockBackend, LockState } from '../lock-backend.interface.js';
import { dropConnection, RedlockMaster, type RedlockMasterClient } from './redlock-master.js';
import { describeMaster, resolveRedlockOptions, type RedlockLockBackendOptions, type ResolvedRedlockOptions } from './redlock.options.js';
import { RedlockMasterIdentities } from './redlock-master.identities.js';
import { loadRedlock, openClient, type LoadedScript, type OwnedClient, type RedlockQuorum } from './redlock.package.js';
import { RedlockReleaseSubscriber } from './redlock-release.subscriber.js';
import { RedlockQuorumError, type MasterFailure } from './redlock.errors.js';
import { quorumRound, type Decide, type Votes } from './redlock.round.js';
import { ACQUIRE_SCRIPT, CLEANUP_SCRIPT, EXTEND_SCRIPT, INSPECT_SCRIPT, RELEASE_SCRIPT } from './redlock.scripts.js';

/** What Redlock answers: a lease shortened by drift, and never a fencing token. */
export type RedlockAcquireResult =
  { acquired: true; validityMs: number; fencingToken?: never } | { acquired: false; retryAfterMs?: number };
export type RedlockLockState = LockState & { fencingToken?: never };

/** Upper bound of the random pause before retrying after attempts split the masters, in ms. */
const SPLIT_RETRY_MS = 50;

/** At most one bare-quorum warning per this many ms and backend; the others are counted. */
const BARE_QUORUM_LOG_INTERVAL_MS = 10_000;

const logger = new Logger('DistributedLock');

/**
 * Locks on several independent Redis masters (the Redlock algorithm); the `redlock` package runs
 * each script on each master, the quorum count is ours. A lock exists while a quorum of masters
 * holds it, so it survives the loss of a minority of masters; it relies on bounded clock drift and
 * process pauses, and it hands out no fencing tokens (`fencing = false`): see
 * docs/redlock.md.
 *
 * ```ts
 * new RedlockLockBackend(['redis://10.0.0.1:6379', 'redis://10.0.0.2:6379', 'redis://10.0.0.3:6379'])
 * new RedlockLockBackend({ clients: [new Redis(url1), new Redis(url2), new Redis(url3)], quorum: 3 })
 * ```
 */
export class RedlockLockBackend implements LockBackend {
  readonly name = 'redlock';
  /** No token from Redlock is strictly increasing across clients: handles carry none. */
  readonly fencing = false as const;
  /** Masters that must agree. */
  readonly quorum: number;

  private readonly options: ResolvedRedlockOptions;
  private readonly masters: readonly RedlockMaster[];
  private readonly redlock: RedlockQuorum;
  private readonly isRefusal: (error: Error) => boolean;
  private readonly subscriber: RedlockReleaseSubscriber;
  private readonly identities: RedlockMasterIdentities;
  private bareQuorumLoggedAt = Number.NEGATIVE_INFINITY;
  private bareQuorumSince = 0;

  constructor(clients: readonly (RedlockMasterClient | string)[] | RedlockLockBackendOptions) {
    // First, so a missing package is reported before any client is opened.
    const pkg = loadRedlock();
    this.options = resolveRedlockOptions(clients, openClient);
    this.quorum = this.options.quorum;
    const patient = new Set([RELEASE_SCRIPT, sha1(RELEASE_SCRIPT), CLEANUP_SCRIPT]);
    this.masters = this.options.clients.map(
      (client) =>
        new RedlockMaster(client, describeMaster(client), this.options.masterTimeout, patient, this.options.owned.includes(client)),
    );
    for (const master of this.masters) master.preload([ACQUIRE_SCRIPT, EXTEND_SCRIPT, RELEASE_SCRIPT]);
    // retryCount 0: we never call its retrying methods (their expiry counts from the first
    // attempt, node-redlock #168/#169/#283); LockService owns waiting. Scripts are passed as
    // functions: 5.0.0-beta.2 ignores scripts given as strings despite its typings.
    this.redlock = new pkg.default(this.masters, { retryCount: 0 }, {
      acquireScript: () => ACQUIRE_SCRIPT,
      extendScript: () => EXTEND_SCRIPT,
      releaseScript: () => RELEASE_SCRIPT,
    } as never);
    if (this.redlock.scripts.releaseScript.value !== RELEASE_SCRIPT || this.redlock.scripts.extendScript.value !== EXTEND_SCRIPT) {
      throw new LockBackendError(
        this.name,
        'the installed redlock package did not take our scripts; install redlock@5.0.0-beta.2 exactly.',
      );
    }
    const { ResourceLockedError } = pkg;
    this.isRefusal = (error) => error instanceof ResourceLockedError;
    this.subscriber = new RedlockReleaseSubscriber(this.masters, this.quorum, this.options.subscribeTimeout);
    this.identities = new RedlockMasterIdentities(this.masters);
  }

  /**
   * What logs show of the backend (`util.inspect`, `JSON.stringify`): not its masters' URLs or
   * options, which hold passwords, nor its waiters' owner tokens.
   */
  toJSON(): { name: string; masters: number; quorum: number } {
    return { name: this.name, masters: this.masters.length, quorum: this.quorum };
  }

  [inspect.custom](depth: number, options: object): string {
    return `RedlockLockBackend ${inspect(this.toJSON(), { ...options, depth })}`;
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number): Promise<RedlockAcquireResult> {
    await this.identities.verified();
    const started = performance.now();
    const q = this.quorum;
    const { answer, votes, settled } = await this.round(this.redlock.scripts.acquireScript, keys, [owner, Math.ceil(ttlMs)], (votes) => {
      const taken = votes.granted.length;
      if (taken >= q) return 'won';
      if (taken + votes.pending >= q) return undefined;
      // Lost. Masters that answered (either way) show whether someone else may hold a quorum.
      const answered = taken + votes.refused.length;
      if (answered >= q) return 'busy';
      if (answered + votes.pending < q) return 'no quorum';
      return undefined;
    });
    if (answer === 'won') {
      const elapsed = performance.now() - started;
      // Redlock's validity: ttl - elapsed - drift, from the moment the quorum answered. Every
      // master set its key after `started`, so counted from the request (as the interface wants)
      // that is ttl - drift.
      const validity = ttlMs - elapsed - this.drift(ttlMs);
      if (validity > 0) {
        void settled.then((votes) => this.noteBareQuorum('acquire', keys, votes));
        return { acquired: true, validityMs: validity + elapsed };
      }
      this.cleanUp(keys, owner, []);
      throw new LockBackendError(
        this.name,
        `acquiring ${keys.join(', ')} took ${Math.round(elapsed)} ms, more than its ttl of ${ttlMs} ms minus the allowed clock drift: ` +
          `the lock would be expired before use, so it was released. Raise the ttl, or check the masters' latency.`,
      );
    }
    // Keys we set on a minority would block everyone until they expire: take them back, without
    // waiting for a frozen master.
    this.cleanUp(keys, owner, votes.refused);
    // Masters still holding a key that is being released elsewhere wake this waiter when they free it.
    if (votes.refused.length > 0) this.subscriber.attemptFailed(this.channels(keys), started, votes.refused);
    if (answer === 'no quorum') throw new RedlockQuorumError('acquire', keys, q, this.masters.length, votes.failures);
    // Every master answered and none of them with a quorum of refusals: competing attempts split
    // the masters, and no release will come to wake us. Retry soon, at a random moment, so they
    // do not split again.
    if (votes.refused.length < q && votes.failures.length === 0 && votes.pending === 0) {
      return { acquired: false, retryAfterMs: Math.random() * SPLIT_RETRY_MS };
    }
    return { acquired: false };
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    await this.identities.verified();
    const q = this.quorum;
    const { answer, settled } = await this.round(this.redlock.scripts.extendScript, keys, [owner, Math.ceil(ttlMs)], (votes, n) => {
      if (votes.granted.length >= q) return true;
      // Refused by so many masters that no quorum can still hold it for us: lost for sure.
      if (n - votes.refused.length < q) return false;
      if (votes.granted.length + votes.pending < q && n - votes.refused.length - votes.pending >= q) {
        throw new RedlockQuorumError('extend', keys, q, n, votes.failures);
      }
      return undefined;
    });
    if (!answer) return { extended: false };
    void settled.then((votes) => this.noteBareQuorum('extend', keys, votes));
    // Counted from the request, like an acquisition: the Lease turns it into a deadline, and one
    // that is already past makes it report the lock lost.
    return { extended: true, validityMs: ttlMs - this.drift(ttlMs) };
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    await this.identities.verified();
    const q = this.quorum;
    const { answer } = await this.round(this.redlock.scripts.releaseScript, keys, [owner, this.options.channelPrefix], (votes, n) => {
      if (votes.granted.length >= q) return true;
      // A quorum answered that it held nothing of ours: whatever the others have is no lock.
      if (votes.refused.length >= q && votes.granted.length === 0) return false;
      if (votes.pending > 0) return undefined;
      if (votes.granted.length > 0) return true;
      if (n - votes.failures.length >= q) return false;
      throw new RedlockQuorumError('release', keys, q, n, votes.failures);
    });
    return answer;
  }

  async inspect(key: string): Promise<RedlockLockState | undefined> {
    await this.identities.verified();
    const answers = await Promise.allSettled(this.masters.map((master) => master.eval(INSPECT_SCRIPT, 1, [key])));
    const failures: MasterFailure[] = [];
    const leases = new Map<string, number[]>();
    answers.forEach((answer, i) => {
      if (answer.status === 'rejected') {
        failures.push({ master: this.masters[i].name, error: toError(answer.reason) });
        return;
      }
      const [owner, pttl] = answer.value as [string | null, number];
      if (typeof owner !== 'string' || pttl === -2) return;
      const list = leases.get(owner) ?? [];
      list.push(pttl < 0 ? Number.POSITIVE_INFINITY : pttl);
      leases.set(owner, list);
    });
    if (this.masters.length - failures.length < this.quorum) {
      throw new RedlockQuorumError('inspect', [key], this.quorum, this.masters.length, failures);
    }
    // The lock exists while a quorum holds it: its remaining lease is the quorum-th longest.
    for (const [owner, pttls] of leases) {
      if (pttls.length < this.quorum) continue;
      pttls.sort((a, b) => b - a);
      return { key, owner, ttlMs: pttls[this.quorum - 1] };
    }
    return undefined;
  }

  /** How many masters answer a trivial script (each within `masterTimeout`), against the quorum. */
  async health(): Promise<BackendHealth> {
    const answers = await Promise.allSettled(this.masters.map((master) => master.eval('return 1', 0, [])));
    const down = this.masters.filter((_, i) => answers[i].status === 'rejected').map((master) => master.name);
    const details = { mastersUp: this.masters.length - down.length, masters: this.masters.length, quorum: this.quorum, down };
    if (details.mastersUp >= this.quorum) return { up: true, details };
    const why = this.masters.filter((_, i) => answers[i].status === 'rejected').map((master) => master.unreachable());
    return {
      up: false,
      details,
      message:
        `${details.mastersUp} of ${this.masters.length} Redlock masters answer, fewer than the quorum of ${this.quorum}: ` +
        `no lock can be taken (${why.join('; ')}).`,
    };
  }

  /**
   * At start-up: masters that are not distinct masters (one server under two names, a replica, a
   * Cluster node), or so many masters refusing this client for good (credentials, no such
   * database, ACL) that no quorum is left, reject with a permanent LockBackendError. Masters that
   * cannot be reached do not: lock operations fail until a quorum is back.
   */
  async verify(): Promise<void> {
    try {
      await this.identities.verified();
    } catch (error) {
      if (!(error instanceof InvalidLockOptionsError)) throw error;
      throw new LockBackendError(this.name, error.message, error, { permanent: true });
    }
    const answers = await Promise.allSettled(this.masters.map((master) => master.eval('return 1', 0, [])));
    const failures: MasterFailure[] = [];
    answers.forEach((answer, i) => {
      if (answer.status === 'rejected') failures.push({ master: this.masters[i].name, error: toError(answer.reason) });
    });
    const refusals = failures.filter((failure) => refusalOf(failure.error) !== undefined);
    if (refusals.length > this.masters.length - this.quorum) {
      throw new RedlockQuorumError('verify', [], this.quorum, this.masters.length, failures);
    }
  }

  watch(keys: readonly string[], onRelease: () => void): Promise<() => void> {
    return this.subscriber.watch(this.channels(keys), onRelease);
  }

  private channels(keys: readonly string[]): string[] {
    return keys.map((key) => this.options.channelPrefix + key);
  }

  /**
   * Closes the connections this backend opened (subscribers, and clients it created from URLs);
   * the clients you passed stay open.
   */
  async close(): Promise<void> {
    this.identities.close();
    await this.subscriber.close();
    await Promise.allSettled((this.options.owned as OwnedClient[]).map((client) => this.quit(client)));
  }

  /**
   * QUIT, so commands already sent get their answers; a frozen master keeps the connection open
   * and never answers it, so the connection is dropped after `masterTimeout`.
   */
  private async quit(client: OwnedClient): Promise<void> {
    if (client.status !== 'ready') return dropConnection(client);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), this.options.masterTimeout)));
    const answered = await Promise.race([
      client.quit().then(
        () => true,
        () => true,
      ),
      late,
    ]);
    clearTimeout(timer);
    if (answered) client.disconnect();
    else dropConnection(client);
  }

  private round<T>(script: LoadedScript, keys: readonly string[], args: (string | number)[], decide: Decide<T>) {
    return quorumRound(this.redlock, this.masters, script, keys, args, this.isRefusal, decide);
  }

  /**
   * A lock on exactly a quorum is one lost or emptied master away from a second owner, until an
   * extension re-creates the key on the others: worth a line in the logs.
   */
  private noteBareQuorum(operation: 'acquire' | 'extend', keys: readonly string[], votes: Votes): void {
    if (votes.granted.length !== this.quorum || this.quorum === this.masters.length) return;
    // While a master is down every lock is on a bare quorum: one line per interval, with a count.
    const now = performance.now();
    if (now - this.bareQuorumLoggedAt < BARE_QUORUM_LOG_INTERVAL_MS) {
      this.bareQuorumSince++;
      return;
    }
    const more = this.bareQuorumSince > 0 ? ` (and ${this.bareQuorumSince} more since the last such message)` : '';
    this.bareQuorumLoggedAt = now;
    this.bareQuorumSince = 0;
    const missing = [
      ...votes.refused.map((master) => `master ${master.name}: held by another owner`),
      ...votes.failures.map((failure) => failure.error.message),
    ];
    logger.warn(
      `RedlockLockBackend: ${operation} of ${keys.join(', ')} won on exactly a quorum (${this.quorum} of ${this.masters.length} masters; ` +
        `${missing.join('; ')})${more}. One more lost or emptied master could let a second owner in, until an extension re-creates the key there.`,
    );
  }

  /**
   * Deletes what this owner set, without announcing it and without waiting, on every master that
   * did not refuse (one that has not answered may still set the keys). Sent at once, by text (a
   * NOSCRIPT retry would come later), so on each connection it runs after this attempt and before
   * the owner's next one, which it must not undo. Each request is bounded; what it could not
   * delete expires with its ttl.
   */
  private cleanUp(keys: readonly string[], owner: string, refused: readonly RedlockMaster[]): void {
    for (const master of this.masters) {
      if (!refused.includes(master)) master.eval(CLEANUP_SCRIPT, keys.length, [...keys, owner]).catch(() => undefined);
    }
  }

  /** Redlock's allowance for clock drift between masters, plus 2 ms for Redis expiry precision. */
  private drift(ttlMs: number): number {
    return Math.round(ttlMs * this.options.driftFactor) + 2;
  }
}

function sha1(script: string): string {
  return createHash('sha1').update(script).digest('hex');
}

function toError(reason: unknown): Error {
  return reason instanceof Error ? reason : new Error(String(reason));
}
