import { setTimeout as sleep } from 'node:timers/promises';
import { ZooKeeperLockBackend, type LockBackend } from '../../lib/index.js';
import { TcpProxy } from '../../test/support/tcp-proxy.js';
import { ZooKeeperServer } from '../../test/support/zookeeper-server.js';
import type { BackendSpec, ChaosStore, FaultContext, NetworkLink, StoreFault } from '../chaos-store.interface.js';
import type { FaultKind } from '../history.js';

const commandTimeout = 500;

interface Options {
  connectionString: string;
  sessionTimeout: number;
  commandTimeout: number;
}

/**
 * A ZooKeeper ensemble of three; each worker reaches one member (round robin) through a proxy of
 * its own, so network faults cut it off (its session then expires, and it makes a new one).
 * Faults: the leader killed and restarted (an election), and the leader frozen (SIGSTOP) for up to
 * twice the ttl (the followers elect another; the frozen one rejoins as a follower).
 */
export default class ZooKeeperStore implements ChaosStore {
  readonly name = 'zookeeper';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = commandTimeout;
  /** The session timeout: a cut-off worker's nodes go when its session expires. */
  readonly recoveryMs = 2_000;
  private ensemble!: ZooKeeperServer;
  private readonly proxies = new Map<string, TcpProxy>();
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
      this.proxies.set(worker, (proxy = await TcpProxy.start(this.ensemble.ports[member])));
    }
    const options: Options = { connectionString: `127.0.0.1:${proxy.port}`, sessionTimeout: 2_000, commandTimeout };
    return { store: this.name, options };
  }

  links(worker: string): NetworkLink[] {
    const proxy = this.proxies.get(worker);
    return proxy ? [{ name: 'zookeeper', proxies: [proxy] }] : [];
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

export function createBackend(options: unknown): LockBackend {
  const { connectionString, sessionTimeout, commandTimeout } = options as Options;
  return new ZooKeeperLockBackend(connectionString, { sessionTimeout, commandTimeout });
}
