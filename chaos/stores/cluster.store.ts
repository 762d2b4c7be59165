import type { Redis } from 'ioredis';
import { RedisLockBackend, type LockBackend } from '../../lib/index.js';
import { RedisCluster } from '../../test/support/redis-cluster.js';
import type { RedisServer } from '../../test/support/redis-server.js';
import { TcpProxy } from '../../test/support/tcp-proxy.js';
import { until } from '../../test/support/wait.js';
import type { BackendSpec, ChaosStore, FaultContext, NetworkLink, StoreFault } from '../chaos-store.interface.js';
import { now, type FaultKind, type HistoryEvent } from '../history.js';
import { REDIS_COMMAND_TIMEOUT, redisServerFaults } from './redis-server.faults.js';

interface Options {
  nodes: { host: string; port: number }[];
  /** The addresses the nodes announce, as this worker reaches them: its own proxies. */
  natMap: Record<string, { host: string; port: number }>;
  commandTimeout: number;
}

/** How often the harness asks every node for its role, to see a failover when it happens. */
const ROLE_POLL_MS = 100;

/**
 * A Redis Cluster of three masters, each with a replica (cluster-node-timeout 5 s). Faults hit a
 * master chosen by the seed: restarted empty or from a snapshot, frozen for less than the node
 * timeout, failed over on request (CLUSTER FAILOVER on its replica: coordinated, the replica
 * catches up first), or killed: its replica takes over once the others mark it failed, without
 * what it had not replicated, and the killed node comes back as a replica. Each worker reaches
 * every node through a proxy of its own (ioredis's `natMap`); a network fault hits all of them.
 * The harness watches every node's role: a replica turned master is a failover in the history.
 */
export default class ClusterStore implements ChaosStore {
  readonly name = 'cluster';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = REDIS_COMMAND_TIMEOUT;
  /** cluster-node-timeout (5 s), then the replica's election, and clients reading the new slots. */
  readonly recoveryMs = 6_000;
  private cluster!: RedisCluster;
  private victim!: RedisServer;
  private readonly proxies = new Map<string, TcpProxy[]>();
  private watching: NodeJS.Timeout | undefined;
  readonly faults: Partial<Record<FaultKind, StoreFault>> = {
    ...Object.fromEntries(
      Object.entries(
        redisServerFaults(
          () => this.victim,
          () => this.admin(this.victim),
          'cluster-master',
        ),
      )
        .filter(([kind]) => kind !== 'store-sleep')
        .map(([kind, fault]) => [
          kind,
          async (context: FaultContext) => {
            this.victim = await this.pickMaster(context);
            return fault(context);
          },
        ]),
    ),
    failover: async (context) => {
      const master = await this.pickMaster(context);
      const replica = await this.replicaOf(master);
      if (!replica) return 'none';
      await this.admin(replica)
        .call('CLUSTER', 'FAILOVER')
        .catch(() => undefined);
      await until(async () => (await this.roleOf(replica)) === 'master', 10_000, `port ${replica.port} to take over`).catch(
        () => undefined,
      );
      return `cluster-master:${master.port}`;
    },
    'kill-master': async (context) => {
      const master = await this.pickMaster(context);
      const replica = await this.replicaOf(master);
      // Without a replica its slots would stay down until it came back.
      if (!replica) return 'none';
      await master.kill();
      try {
        // The others mark it failed after the node timeout; its replica is elected then.
        await until(async () => (await this.roleOf(replica)) === 'master', 30_000, `port ${replica.port} to take over`);
      } finally {
        // Back with its nodes.conf: it learns of the newer epoch and follows the new master.
        await master.restart();
      }
      return `cluster-master:${master.port}`;
    },
  };

  async start(): Promise<void> {
    this.cluster = await RedisCluster.start({ masters: 3 });
    for (const server of [...this.cluster.servers]) await this.cluster.addReplica(server.port);
    // The harness kills and restarts nodes: its own connections to them fail meanwhile.
    for (const server of this.cluster.servers) this.admin(server).on('error', () => undefined);
  }

  async backendFor(worker: string): Promise<BackendSpec> {
    const proxies = await Promise.all(this.cluster.servers.map((server) => TcpProxy.start(server.port)));
    this.proxies.set(worker, proxies);
    const options: Options = {
      nodes: proxies.map((proxy) => ({ host: '127.0.0.1', port: proxy.port })),
      natMap: Object.fromEntries(proxies.map((proxy) => [`127.0.0.1:${proxy.targetPort}`, { host: '127.0.0.1', port: proxy.port }])),
      commandTimeout: this.commandTimeout,
    };
    return { store: this.name, options };
  }

  links(worker: string): NetworkLink[] {
    const proxies = this.proxies.get(worker);
    return proxies ? [{ name: 'cluster', proxies }] : [];
  }

  /**
   * Polls every node's role; a node that turns from replica to master is a failover, recorded as
   * a window from the last poll that saw it a replica to the poll that saw it master (the checker
   * adds the time clients take to follow).
   */
  async observe(record: (event: HistoryEvent) => void): Promise<void> {
    const roles = new Map<number, { role: string; t: number }>();
    const poll = async () => {
      for (const server of this.cluster.servers) {
        if (!server.running) continue;
        const role = await this.roleOf(server).catch(() => undefined);
        const t = now();
        if (role === undefined) continue;
        const before = roles.get(server.port);
        roles.set(server.port, { role, t });
        if (!before || before.role === role) continue;
        record({ t, type: 'store', event: 'role', detail: `${server.port} ${before.role} -> ${role}` });
        if (role === 'master') {
          record({ t: before.t, type: 'failover', phase: 'start', server: String(server.port) });
          record({ t, type: 'failover', phase: 'end', server: String(server.port) });
        }
      }
    };
    await poll();
    const loop = async () => {
      await poll().catch(() => undefined);
      if (this.watching) this.watching = setTimeout(loop, ROLE_POLL_MS);
    };
    this.watching = setTimeout(loop, ROLE_POLL_MS);
  }

  async stop(): Promise<void> {
    const watching = this.watching;
    this.watching = undefined;
    clearTimeout(watching);
    for (const proxies of this.proxies.values()) for (const proxy of proxies) await proxy.close();
    await this.cluster.stop();
  }

  private admin(server: RedisServer): Redis {
    return this.cluster.admin(server.port);
  }

  private async roleOf(server: RedisServer): Promise<string> {
    return ((await this.admin(server).call('ROLE')) as [string])[0];
  }

  private async pickMaster({ next }: FaultContext): Promise<RedisServer> {
    const masters: RedisServer[] = [];
    for (const server of this.cluster.servers)
      if (server.running && (await this.roleOf(server).catch(() => undefined)) === 'master') masters.push(server);
    return masters[Math.floor(next() * masters.length)];
  }

  /** Its replica as the master's own view of the cluster says (connected or not), if it has one. */
  private async replicaOf(master: RedisServer): Promise<RedisServer | undefined> {
    const lines = ((await this.admin(master).call('CLUSTER', 'NODES')) as string).trim().split('\n');
    const rows = lines.map((line) => line.split(' '));
    const self = rows.find((row) => row[2].includes('myself'))?.[0];
    const port = rows.find((row) => row[3] === self && !row[2].includes('fail'))?.[1].split(/[:@]/)[1];
    return this.cluster.servers.find((server) => server.running && server.port === Number(port));
  }
}

export function createBackend(options: unknown, waiterTimeout: number): LockBackend {
  const { nodes, natMap, commandTimeout } = options as Options;
  return new RedisLockBackend({ clusterNodes: nodes, clusterOptions: { natMap } }, { commandTimeout, waiterTimeout });
}
