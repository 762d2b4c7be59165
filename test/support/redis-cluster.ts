import { createServer } from 'node:net';
import { Redis } from 'ioredis';
import { freePort, RedisServer } from './redis-server.js';
import { until } from './wait.js';

const SLOTS = 16_384;

/**
 * A Redis Cluster of the test's own: `masters` redis-servers in cluster mode on free ports, the
 * slots split evenly between them, no replicas until `addReplica`. Started empty and joined by the
 * harness itself (ADDSLOTSRANGE, MEET), then ready once every node reports `cluster_state:ok`.
 */
export class RedisCluster {
  private constructor(
    private readonly nodeServers: RedisServer[],
    /** One plain connection per node, for commands a Cluster client would route elsewhere. */
    private readonly admins: Redis[],
  ) {}

  get servers(): readonly RedisServer[] {
    return this.nodeServers;
  }

  static async start(options: { masters?: number; timeoutMs?: number } = {}): Promise<RedisCluster> {
    const masters = options.masters ?? 3;
    const servers: RedisServer[] = [];
    const admins: Redis[] = [];
    try {
      for (let i = 0; i < masters; i++) {
        const server = await startNode();
        servers.push(server);
        admins.push(new Redis(server.port, '127.0.0.1', { maxRetriesPerRequest: 1 }));
      }
      const cluster = new RedisCluster(servers, admins);
      await cluster.join(options.timeoutMs ?? 15_000);
      return cluster;
    } catch (error) {
      for (const admin of admins) admin.disconnect();
      await Promise.all(servers.map((server) => server.stop()));
      throw error;
    }
  }

  /** Startup nodes for `new Cluster(...)` or `{ clusterNodes }`. */
  get nodes(): { host: string; port: number }[] {
    return this.nodeServers.map((server) => ({ host: '127.0.0.1', port: server.port }));
  }

  /** The port of the master serving `key`, as Redis itself hashes it (CLUSTER KEYSLOT). */
  async portOf(key: string): Promise<number> {
    return this.portOfSlot(await this.slotOf(key));
  }

  async slotOf(key: string): Promise<number> {
    return (await this.admins[0].call('CLUSTER', 'KEYSLOT', key)) as number;
  }

  /** The plain connection to the node on `port`. */
  admin(port: number): Redis {
    const index = this.servers.findIndex((server) => server.port === port);
    if (index < 0) throw new Error(`no node on port ${port}`);
    return this.admins[index];
  }

  /** Empties every node (FLUSHALL on a Cluster client reaches one node only). */
  async flushAll(): Promise<void> {
    await Promise.all(this.admins.map((admin) => admin.flushall()));
  }

  /** Connections open on every node, not counting the harness's own (its admins, its MIGRATEs). */
  async clientCounts(): Promise<number[]> {
    return Promise.all(this.admins.map(async (admin) => (await clientList(admin)) - 1));
  }

  /** Adds a replica of the master on `masterPort`; resolves once it has synced with it. */
  async addReplica(masterPort: number, timeoutMs = 15_000): Promise<RedisServer> {
    const server = await startNode();
    const admin = new Redis(server.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
    this.nodeServers.push(server);
    this.admins.push(admin);
    const masterId = (await this.admin(masterPort).call('CLUSTER', 'MYID')) as string;
    await admin.call('CLUSTER', 'MEET', '127.0.0.1', masterPort);
    // It can only replicate a node it knows: wait for the handshake to name the master.
    await until(
      async () => ((await admin.call('CLUSTER', 'NODES')) as string).includes(masterId),
      timeoutMs,
      `port ${server.port} to know its master`,
    );
    await admin.call('CLUSTER', 'REPLICATE', masterId);
    await until(
      async () => (await admin.info('replication')).includes('master_link_status:up'),
      timeoutMs,
      `port ${server.port} to sync with ${masterPort}`,
    );
    return server;
  }

  /**
   * Makes the replica on `port` a master at once, taking its master's slots without a vote (CLUSTER
   * FAILOVER TAKEOVER, for a master that is gone); resolves once every running node agrees.
   */
  async promote(port: number, timeoutMs = 15_000): Promise<void> {
    await this.admin(port).call('CLUSTER', 'FAILOVER', 'TAKEOVER');
    const running = this.admins.filter((_, i) => this.nodeServers[i].running);
    await until(
      async () => {
        const views = await Promise.all(
          running.map((admin) => admin.call('CLUSTER', 'SLOTS') as Promise<[number, number, [string, number]][]>),
        );
        return views.every((ranges) => ranges.some(([, , [, master]]) => master === port));
      },
      timeoutMs,
      `every running node to see port ${port} as a master`,
    );
  }

  /**
   * Moves a slot, keys and all, to the master on `toPort`, as `redis-cli --cluster reshard` does:
   * IMPORTING on the target, MIGRATING on the source, MIGRATE of every key, then the new owner set
   * on every node. Resolves once every node serves the slot from its new owner.
   */
  async moveSlot(slot: number, toPort: number): Promise<void> {
    const fromPort = await this.portOfSlot(slot);
    if (fromPort === toPort) return;
    const [from, to] = [this.admin(fromPort), this.admin(toPort)];
    const [fromId, toId] = await Promise.all([from.call('CLUSTER', 'MYID'), to.call('CLUSTER', 'MYID')]);
    await to.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', fromId as string);
    await from.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', toId as string);
    for (;;) {
      const keys = (await from.call('CLUSTER', 'GETKEYSINSLOT', slot, 100)) as string[];
      if (keys.length === 0) break;
      await from.call('MIGRATE', '127.0.0.1', toPort, '', 0, 5_000, 'KEYS', ...keys);
    }
    // The new owner first, as redis-cli does, so no node points back at the source meanwhile.
    const others = this.admins.filter((admin) => admin !== to);
    for (const admin of [to, ...others]) await admin.call('CLUSTER', 'SETSLOT', slot, 'NODE', toId as string);
    await until(
      async () => (await Promise.all(this.admins.map((admin) => ownerOf(admin, slot)))).every((port) => port === toPort),
      10_000,
      `every node to serve slot ${slot} from port ${toPort}`,
    );
  }

  private async portOfSlot(slot: number): Promise<number> {
    const port = await ownerOf(this.admins[0], slot);
    if (port === undefined) throw new Error(`no node serves slot ${slot}`);
    return port;
  }

  async stop(): Promise<void> {
    for (const admin of this.admins) admin.disconnect();
    await Promise.all(this.servers.map((server) => server.stop()));
  }

  private async join(timeoutMs: number): Promise<void> {
    const n = this.admins.length;
    await Promise.all(
      this.admins.map(async (admin, i) => {
        // Distinct epochs up front, as redis-cli --cluster create does: no collision to resolve later.
        await admin.call('CLUSTER', 'SET-CONFIG-EPOCH', i + 1);
        await admin.call('CLUSTER', 'ADDSLOTSRANGE', Math.floor((i * SLOTS) / n), Math.floor(((i + 1) * SLOTS) / n) - 1);
      }),
    );
    // Every node meets every other directly: no waiting for gossip to introduce them.
    await Promise.all(
      this.admins.flatMap((admin, i) => this.servers.slice(i + 1).map((server) => admin.call('CLUSTER', 'MEET', '127.0.0.1', server.port))),
    );
    // Gossip spreads the slot map; a node says ok only once it sees every slot served.
    await until(
      async () => {
        const infos = await Promise.all(this.admins.map((admin) => admin.call('CLUSTER', 'INFO') as Promise<string>));
        return infos.every((info) => info.includes('cluster_state:ok') && info.includes(`cluster_known_nodes:${n}\r`));
      },
      timeoutMs,
      `a ${n}-node cluster to reach cluster_state:ok on every node`,
    );
  }
}

/** Cluster-bus ports are port + 10000, so both must be free. A lost race shows as a failed launch. */
async function startNode(): Promise<RedisServer> {
  let lastError: unknown = new Error('found no port p with p + 10000 free too');
  for (let attempt = 1; attempt <= 20; attempt++) {
    const port = await freePort();
    if (port + 10_000 > 65_535 || !(await isFree(port + 10_000))) continue;
    try {
      return await RedisServer.start({
        port,
        args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '5000'],
      });
    } catch (error) {
      lastError = error;
    }
  }
  throw lastError;
}

async function isFree(port: number): Promise<boolean> {
  const server = createServer();
  const listening = await new Promise<boolean>((resolve) =>
    server.once('error', () => resolve(false)).listen(port, '127.0.0.1', () => resolve(true)),
  );
  if (listening) await new Promise<void>((resolve) => server.close(() => resolve()));
  return listening;
}

/** The port of the master that `admin`'s node says serves `slot`. */
async function ownerOf(admin: Redis, slot: number): Promise<number | undefined> {
  const ranges = (await admin.call('CLUSTER', 'SLOTS')) as [number, number, [string, number, ...unknown[]]][];
  return ranges.find(([start, end]) => slot >= start && slot <= end)?.[2][1];
}

async function clientList(admin: Redis): Promise<number> {
  const list = (await admin.call('CLIENT', 'LIST')) as string;
  // Not the connection a MIGRATE of moveSlot left from node to node (Redis keeps it for 10 s).
  return list.split('\n').filter((line) => line.trim() !== '' && !line.includes(' cmd=restore-asking ')).length;
}
