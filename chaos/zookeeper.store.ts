import { setTimeout as sleep } from 'node:timers/promises';
import { ZooKeeperServer } from '../test/support/zookeeper-server.js';
import type { BackendSpec } from './chaos.worker.js';
import type { FaultKind } from './history.js';
import type { ChaosStore, FaultContext, StoreFault } from './store.adapters.js';
import { ChaosProxy } from './tcp-proxy.js';

const commandTimeout = 500;

/**
 * A ZooKeeper ensemble of three; each worker reaches one member (round robin) through a proxy of
 * its own, so network faults cut it off (its session then expires, and it makes a new one).
 * Faults: the leader killed and restarted (an election), and the leader frozen (SIGSTOP) for up to
 * twice the ttl (the followers elect another; the frozen one rejoins as a follower).
 */
export class ZooKeeperStore implements ChaosStore {
  readonly name = 'zookeeper';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = commandTimeout;
  private ensemble!: ZooKeeperServer;
  private readonly proxies = new Map<string, ChaosProxy>();
  readonly faults: Partial<Record<FaultKind, StoreFault>> = {
    failover: async () => {
      const leader = await this.leader();
      await this.ensemble.kill(leader);
      await sleep(500);
      await this.ensemble.restart(leader);
      return `zookeeper-${leader}`;
    },
    'pause-store': async ({ next, ttl }: FaultContext) => {
      const leader = await this.leader();
      const pid = this.ensemble.pid(leader)!;
      process.kill(pid, 'SIGSTOP');
      await sleep(200 + Math.floor(next() * ttl * 2));
      process.kill(pid, 'SIGCONT');
      return `zookeeper-${leader}`;
    },
  };

  async start(): Promise<void> {
    this.ensemble = await ZooKeeperServer.startEnsemble();
  }

  async backendFor(worker: string): Promise<BackendSpec> {
    let proxy = this.proxies.get(worker);
    if (!proxy) {
      const member = this.proxies.size % this.ensemble.ports.length;
      this.proxies.set(worker, (proxy = await ChaosProxy.start(this.ensemble.ports[member])));
    }
    return { kind: 'zookeeper', connectionString: `127.0.0.1:${proxy.port}`, sessionTimeout: 2_000, commandTimeout };
  }

  proxyOf(worker: string): ChaosProxy | undefined {
    return this.proxies.get(worker);
  }

  async stop(): Promise<void> {
    for (const proxy of this.proxies.values()) await proxy.close();
    await this.ensemble.stop();
  }

  /** The member that leads now; the first one while an election is still on. */
  private async leader(): Promise<number> {
    await this.ensemble.ready().catch(() => undefined);
    return (await this.ensemble.leader()) ?? 1;
  }
}
