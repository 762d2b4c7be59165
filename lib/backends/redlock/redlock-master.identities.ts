import { Logger } from '@nestjs/common';
import { InvalidLockOptionsError } from '../../lock.errors.js';
import type { RedlockMaster } from './redlock-master.js';

const logger = new Logger('DistributedLock');

/**
 * What each master says it is, asked on its first connection (`INFO`): addresses cannot tell that
 * `127.0.0.1:6379` and `localhost:6379` (or two DNS names) are one server that would vote twice,
 * nor that a server is a replica (it refuses writes, so it never votes for a lock) or a Cluster
 * node (each key lives on one node only). Any of these is refused with `InvalidLockOptionsError`.
 *
 * The answer comes asynchronously, so the first operation of the backend waits for the masters
 * that answer within `masterTimeout`; a master that was down then is identified when it
 * connects, and a refusal found then fails every operation from that moment on.
 */
export class RedlockMasterIdentities {
  private readonly runIds = new Map<string, RedlockMaster>();
  private first: Promise<void> | undefined;
  private refusal: InvalidLockOptionsError | undefined;
  private closed = false;

  constructor(private readonly masters: readonly RedlockMaster[]) {}

  /** Resolves once the masters reachable at first use are identified; rejects with a refusal. */
  async verified(): Promise<void> {
    this.first ??= Promise.all(this.masters.map((master) => this.identify(master))).then(() => undefined);
    await this.first;
    if (this.refusal) throw this.refusal;
  }

  close(): void {
    this.closed = true;
  }

  private async identify(master: RedlockMaster): Promise<void> {
    let info: string;
    try {
      info = await master.info();
    } catch {
      // Down or frozen now: asked again when it connects.
      master.client.once?.('ready', () => void (this.closed || this.refusal ? undefined : this.identify(master)));
      return;
    }
    const field = (name: string) => new RegExp(`^${name}:(.*)$`, 'm').exec(info)?.[1]?.trim();
    const problem = this.problem(master, field);
    if (problem && !this.refusal) {
      this.refusal = new InvalidLockOptionsError('clients', `RedlockLockBackend: ${problem}`);
      logger.error(this.refusal.message);
    }
  }

  private problem(master: RedlockMaster, field: (name: string) => string | undefined): string | undefined {
    if (field('role') === 'slave') {
      return (
        `master ${master.name} is a replica (of ${field('master_host')}:${field('master_port')}): it refuses writes, so it never holds a lock, ` +
        `and the others must all answer. List independent masters only, never a replica of one of them.`
      );
    }
    if (field('cluster_enabled') === '1') {
      return (
        `master ${master.name} is a node of a Redis Cluster: a Cluster keeps each key on one node, so its nodes cannot vote on a lock ` +
        `(every acquire would miss a quorum). Use independent standalone masters, or the Redis backend with a Cluster client.`
      );
    }
    const runId = field('run_id');
    if (runId === undefined) return undefined;
    const twin = this.runIds.get(runId);
    if (twin && twin !== master) {
      // Named in the order they were listed, whichever answered first.
      const [one, other] = this.masters.indexOf(twin) < this.masters.indexOf(master) ? [twin, master] : [master, twin];
      return (
        `masters ${one.name} and ${other.name} are the same redis-server (run_id ${runId}): one server would vote twice, ` +
        `and a quorum would not mean a majority of servers. List each server once.`
      );
    }
    this.runIds.set(runId, master);
    return undefined;
  }
}
