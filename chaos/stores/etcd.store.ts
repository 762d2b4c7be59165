import { setTimeout as sleep } from 'node:timers/promises';
import { EtcdLockBackend, type LockBackend } from '../../lib/index.js';
import { EtcdCluster } from '../../test/support/etcd-server.js';
import { TcpProxy } from '../../test/support/tcp-proxy.js';
import type { BackendSpec, ChaosStore, FaultContext, NetworkLink, StoreFault } from '../chaos-store.interface.js';
import type { FaultKind } from '../history.js';

const commandTimeout = 1_000;

interface Options {
  endpoints: string[];
  commandTimeout: number;
}

/**
 * An etcd cluster of three members; each worker reaches every member through a proxy of its own,
 * one network link per member, so a network fault cuts or slows it from one member (its client
 * goes to another) while the others still answer. Faults: the leader killed and restarted (an
 * election; etcd 3.4 restarts every lease's ttl then), the leader frozen (SIGSTOP) for up to twice
 * the ttl, and a follower restarted. None of them lets two holders in: a quorum keeps every lease.
 */
export default class EtcdStore implements ChaosStore {
  readonly name = 'etcd';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = commandTimeout;
  /** The election timeout (1 s) and a second for the client to find the new leader. */
  readonly recoveryMs = 2_000;
  private cluster!: EtcdCluster;
  private readonly proxies = new Map<string, TcpProxy[]>();
  readonly faults: Partial<Record<FaultKind, StoreFault>> = {
    failover: async () => {
      const leader = await this.leader();
      await this.cluster.members[leader].kill();
      await sleep(500);
      await this.cluster.restart(leader);
      return `etcd-${this.cluster.members[leader].name}`;
    },
    'pause-store': async ({ next, ttl }: FaultContext) => {
      const leader = this.cluster.members[await this.leader()];
      leader.pause();
      await sleep(200 + Math.floor(next() * ttl * 2));
      leader.resume();
      return `etcd-${leader.name}`;
    },
    'restart-store': async ({ next }: FaultContext) => {
      const leader = await this.leader();
      const followers = this.cluster.members.map((_, i) => i).filter((i) => i !== leader);
      const index = followers[Math.floor(next() * followers.length)];
      await this.cluster.restart(index);
      return `etcd-${this.cluster.members[index].name}`;
    },
  };

  async start(): Promise<void> {
    this.cluster = await EtcdCluster.start({ members: 3 });
  }

  async backendFor(worker: string): Promise<BackendSpec> {
    let proxies = this.proxies.get(worker);
    if (!proxies) {
      proxies = await Promise.all(this.cluster.members.map((member) => TcpProxy.start(member.clientPort)));
      this.proxies.set(worker, proxies);
    }
    const options: Options = { endpoints: proxies.map((proxy) => `http://127.0.0.1:${proxy.port}`), commandTimeout };
    return { store: this.name, options };
  }

  links(worker: string): NetworkLink[] {
    return (this.proxies.get(worker) ?? []).map((proxy, i) => ({ name: `etcd-${this.cluster.members[i].name}`, proxies: [proxy] }));
  }

  async stop(): Promise<void> {
    for (const proxies of this.proxies.values()) for (const proxy of proxies) await proxy.close();
    await this.cluster.stop();
  }

  /** The member that leads now; the first running one while an election is still on. */
  private async leader(): Promise<number> {
    return this.cluster.leader().catch(() =>
      Math.max(
        0,
        this.cluster.members.findIndex((member) => member.running),
      ),
    );
  }
}

export function createBackend(options: unknown, waiterTimeout: number): LockBackend {
  const { endpoints, commandTimeout } = options as Options;
  // The waiter lease's ttl (whole seconds, at least etcd's minimum): a waiter's place goes with it.
  return new EtcdLockBackend(endpoints, { commandTimeout, waiterTimeout });
}
