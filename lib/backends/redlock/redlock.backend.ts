import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { LockBackendError } from '../../lock.errors.js';
import type { ExtendResult, LockBackend, LockState } from '../lock-backend.interface.js';
import { RedlockMaster, type RedlockMasterClient } from './redlock-master.js';
import { describeMaster, resolveRedlockOptions, type RedlockLockBackendOptions, type ResolvedRedlockOptions } from './redlock.options.js';
import { loadRedlock, openClient, type LoadedScript, type OwnedClient, type QuorumStats, type RedlockQuorum } from './redlock.package.js';
import { RedlockReleaseSubscriber } from './redlock-release.subscriber.js';
import { RedlockQuorumError, type MasterFailure } from './redlock.errors.js';
import { ACQUIRE_SCRIPT, INSPECT_SCRIPT, RELEASE_SCRIPT } from './redlock.scripts.js';

/** What Redlock answers: a lease shortened by drift, and never a fencing token. */
export type RedlockAcquireResult = { acquired: true; validityMs: number; fencingToken?: never } | { acquired: false; retryAfterMs?: never };
export type RedlockLockState = LockState & { fencingToken?: never };

/** A master's votes against, split into "someone else holds it" and "no answer". */
interface Tally {
  taken: number;
  refused: number;
  failures: MasterFailure[];
}

/**
 * Locks on several independent Redis masters (the Redlock algorithm), through the `redlock`
 * package's quorum round. A lock exists while a quorum of masters holds it, so it survives the
 * loss of a minority of masters; it relies on bounded clock drift and process pauses, and it
 * hands out no fencing tokens (`fencing = false`): see the README's Redlock section.
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
  /** The package's own rule: it settles a round as soon as a majority voted one way. */
  private readonly majority: number;

  constructor(clients: readonly (RedlockMasterClient | string)[] | RedlockLockBackendOptions) {
    // First, so a missing package is reported before any client is opened.
    const pkg = loadRedlock();
    this.options = resolveRedlockOptions(clients, openClient);
    this.quorum = this.options.quorum;
    const patient = new Set([RELEASE_SCRIPT, sha1(RELEASE_SCRIPT)]);
    this.masters = this.options.clients.map((client) => new RedlockMaster(client, describeMaster(client), this.options.masterTimeout, patient));
    this.majority = Math.floor(this.masters.length / 2) + 1;
    // retryCount 0: the package must not retry (its retries compute expiry from the first
    // attempt, node-redlock #168/#169/#283); LockService owns waiting. Scripts are passed as
    // functions: 5.0.0-beta.2 ignores scripts given as strings despite its typings.
    this.redlock = new pkg.default(this.masters, { retryCount: 0 }, { acquireScript: () => ACQUIRE_SCRIPT, releaseScript: () => RELEASE_SCRIPT } as never);
    if (this.redlock.scripts.releaseScript.value !== RELEASE_SCRIPT) {
      throw new LockBackendError(this.name, 'the installed redlock package did not take our scripts; install redlock@5.0.0-beta.2 exactly.');
    }
    const { ResourceLockedError } = pkg;
    this.isRefusal = (error) => error instanceof ResourceLockedError;
    this.subscriber = new RedlockReleaseSubscriber(this.masters, this.quorum, this.options.subscribeTimeout);
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number): Promise<RedlockAcquireResult> {
    const started = performance.now();
    const { won, stats } = await this.vote(this.redlock.scripts.acquireScript, keys, [owner, Math.ceil(ttlMs)]);
    if (won) {
      const elapsed = performance.now() - started;
      // Redlock's validity: ttl - elapsed - drift, from the moment the quorum answered. Every
      // master set its key after `started`, so counted from the request (as the interface wants)
      // that is ttl - drift.
      const validity = ttlMs - elapsed - this.drift(ttlMs);
      if (validity > 0) return { acquired: true, validityMs: validity + elapsed };
      await this.cleanUp(keys, owner);
      throw new LockBackendError(
        this.name,
        `acquiring ${keys.join(', ')} took ${Math.round(elapsed)} ms, more than its ttl of ${ttlMs} ms minus the allowed clock drift: ` +
          `the lock would be expired before use, so it was released. Raise the ttl, or check the masters' latency.`,
      );
    }
    const tally = this.tally(await stats);
    // Keys we set on a minority would block everyone until they expire: take them back. The
    // release is queued behind our acquire on each connection, so it also catches a late one.
    if (tally.taken > 0 || tally.failures.length > 0) await this.cleanUp(keys, owner);
    if (tally.taken + tally.refused >= this.quorum) return { acquired: false };
    throw new RedlockQuorumError('acquire', keys, this.quorum, this.masters.length, tally.failures);
  }

  async extend(keys: readonly string[], owner: string, ttlMs: number): Promise<ExtendResult> {
    const { won, stats } = await this.vote(this.redlock.scripts.extendScript, keys, [owner, Math.ceil(ttlMs)]);
    // Counted from the request, like an acquisition: the Lease turns it into a deadline, and one
    // that is already past makes it report the lock lost.
    if (won) return { extended: true, validityMs: ttlMs - this.drift(ttlMs) };
    const tally = this.tally(await stats);
    // Refused by so many masters that no quorum can still hold it for us: lost for sure.
    if (this.masters.length - tally.refused < this.quorum) return { extended: false };
    throw new RedlockQuorumError('extend', keys, this.quorum, this.masters.length, tally.failures);
  }

  async release(keys: readonly string[], owner: string): Promise<boolean> {
    const { won, stats } = await this.vote(this.redlock.scripts.releaseScript, keys, [owner, this.options.channelPrefix]);
    if (won) return true;
    const tally = this.tally(await stats);
    if (tally.taken > 0) return true;
    // A quorum answered that it held nothing of ours: whatever the others have is no lock.
    if (this.masters.length - tally.failures.length >= this.quorum) return false;
    throw new RedlockQuorumError('release', keys, this.quorum, this.masters.length, tally.failures);
  }

  async inspect(key: string): Promise<RedlockLockState | undefined> {
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

  watch(keys: readonly string[], onRelease: () => void): Promise<() => void> {
    return this.subscriber.watch(
      keys.map((key) => this.options.channelPrefix + key),
      onRelease,
    );
  }

  /**
   * Closes the connections this backend opened (subscribers, and clients it created from URLs);
   * the clients you passed stay open.
   */
  async close(): Promise<void> {
    await this.subscriber.close();
    await Promise.allSettled(
      (this.options.owned as OwnedClient[]).map((client) => (client.status === 'ready' ? client.quit() : Promise.resolve(client.disconnect()))),
    );
  }

  /** One quorum round; with a quorum above the majority, it waits for every vote to count. */
  private async vote(script: LoadedScript, keys: readonly string[], args: (string | number)[]): Promise<{ won: boolean; stats: Promise<QuorumStats> }> {
    const round = await this.redlock._attemptOperation(script, keys, args);
    if (this.quorum === this.majority) return { won: round.vote === 'for', stats: round.stats };
    const stats = await round.stats;
    return { won: stats.votesFor.size >= this.quorum, stats: Promise.resolve(stats) };
  }

  private tally(stats: QuorumStats): Tally {
    const tally: Tally = { taken: stats.votesFor.size, refused: 0, failures: [] };
    for (const [master, error] of stats.votesAgainst) {
      if (this.isRefusal(error)) tally.refused++;
      else tally.failures.push({ master: master.name, error });
    }
    return tally;
  }

  /** Deletes whatever this owner set, on every master that answers, and waits for all votes. */
  private async cleanUp(keys: readonly string[], owner: string): Promise<void> {
    try {
      const round = await this.redlock._attemptOperation(this.redlock.scripts.releaseScript, keys, [owner, this.options.channelPrefix]);
      await round.stats;
    } catch {
      // Each master's request is bounded; what it could not delete expires with its ttl.
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
