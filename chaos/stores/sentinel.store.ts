import { Redis } from 'ioredis';
import { setTimeout as sleep } from 'node:timers/promises';
import { RedisLockBackend, type LockBackend } from '../../lib/index.js';
import { RedisSentinel } from '../../test/support/redis-sentinel.js';
import type { RedisServer } from '../../test/support/redis-server.js';
import { TcpProxy } from '../../test/support/tcp-proxy.js';
import type { BackendSpec, ChaosStore, FaultContext, NetworkLink, StoreFault } from '../chaos-store.interface.js';
import { now, type FaultKind, type HistoryEvent } from '../history.js';
import { adminClient, REDIS_COMMAND_TIMEOUT, redisServerFaults } from './redis-server.faults.js';

interface Options {
  sentinels: { host: string; port: number }[];
  name: string;
  /** The addresses the sentinel announces, as this worker reaches them: its own proxies. */
  natMap: Record<string, { host: string; port: number }>;
  commandTimeout: number;
}

/**
 * A master, a replica and a sentinel; workers ask the sentinel for the master. Faults: restarts,
 * stalls and freezes of whichever server the sentinel names master at the time (a freeze longer
 * than `down-after-milliseconds` makes the sentinel fail over by itself), and a failover to the
 * replica (SENTINEL FAILOVER), also to a replica left behind on purpose. The sentinel's own events go into the history; its failovers,
 * whoever caused them, become `failover` windows there (see observe()). Each worker reaches the
 * sentinel, the master and the replica through proxies of its own (the sentinel's announcements
 * are mapped to them with ioredis's `natMap`): a network fault cuts or slows the worker's whole
 * path to the store, whichever server is master.
 */
export default class SentinelStore implements ChaosStore {
  readonly name = 'sentinel';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = REDIS_COMMAND_TIMEOUT;
  /** down-after-milliseconds (1 s), the sentinel's failover and clients moving to the new master. */
  readonly recoveryMs = 3_000;
  private setup!: RedisSentinel;
  private readonly admins = new Map<RedisServer, Redis>();
  private victim!: RedisServer;
  private events: Redis | undefined;
  private readonly proxies = new Map<string, TcpProxy[]>();
  readonly faults: Partial<Record<FaultKind, StoreFault>> = {
    ...Object.fromEntries(
      Object.entries(
        redisServerFaults(
          () => this.victim,
          () => this.admins.get(this.victim)!,
          'sentinel-master',
        ),
      ).map(([kind, fault]) => [
        kind,
        async (context: FaultContext) => {
          this.victim = await this.setup.currentMaster();
          return fault(context);
        },
      ]),
    ),
    failover: async () => {
      await this.failover();
      return 'sentinel';
    },
    'failover-lagging-replica': async ({ next, ttl }) => {
      // The master refuses its replica's resynchronisation (PSYNC and SYNC denied by ACL) and
      // drops its link: the replica falls behind while locks are taken, then is promoted.
      const master = await this.setup.currentMaster();
      const admin = this.admins.get(master)!;
      try {
        await admin.call('ACL', 'SETUSER', 'default', '-psync', '-sync');
        await admin.call('CLIENT', 'KILL', 'TYPE', 'replica');
        await sleep(300 + Math.floor(next() * ttl * 1.2));
        await this.failover();
      } finally {
        await admin.call('ACL', 'SETUSER', 'default', '+@all').catch(() => undefined);
      }
      return 'sentinel';
    },
  };

  /** Asks the sentinel to fail over now, and gives it 2 s to do so. */
  private async failover(): Promise<void> {
    const sentinel = new Redis(this.setup.sentinel.port, '127.0.0.1');
    try {
      await sentinel.call('SENTINEL', 'FAILOVER', this.setup.name).catch(() => undefined);
      await sleep(2_000);
    } finally {
      sentinel.disconnect();
    }
  }

  async start(): Promise<void> {
    this.setup = await RedisSentinel.start({ replica: true, downAfterMs: 1_000 });
    for (const server of [this.setup.master, this.setup.replica!]) this.admins.set(server, adminClient(server.port));
    // DEBUG is refused unless enabled at start; the sentinel helper starts servers without it.
    delete this.faults['store-sleep'];
  }

  async backendFor(worker: string): Promise<BackendSpec> {
    const servers = [this.setup.sentinel, this.setup.master, this.setup.replica!];
    const [sentinel, ...data] = await Promise.all(servers.map((server) => TcpProxy.start(server.port)));
    this.proxies.set(worker, [sentinel, ...data]);
    const natMap = Object.fromEntries(data.map((proxy) => [`127.0.0.1:${proxy.targetPort}`, { host: '127.0.0.1', port: proxy.port }]));
    const options: Options = {
      sentinels: [{ host: '127.0.0.1', port: sentinel.port }],
      name: this.setup.name,
      natMap,
      commandTimeout: this.commandTimeout,
    };
    return { store: this.name, options };
  }

  /**
   * Records every event the sentinel publishes (`+sdown`, `+switch-master`, ...), and each of its
   * failovers as a `failover` window: from `+try-failover` (the sentinel starts promoting the
   * replica) to `+switch-master` (it announces the new master; a client that follows failovers
   * moves then), or to `-failover-abort-...` when no switch came of it.
   */
  async observe(record: (event: HistoryEvent) => void): Promise<void> {
    this.events = new Redis(this.setup.sentinel.port, '127.0.0.1').on('error', () => undefined);
    let promoting: string | undefined;
    this.events.on('pmessage', (_pattern: string, channel: string, message: string) => {
      if (channel.startsWith('__sentinel__')) return;
      const t = now();
      record({ t, type: 'store', event: channel, detail: message });
      // '+try-failover master <name> <ip> <port>'; '+switch-master <name> <old ip> <old port> <new ip> <new port>'.
      const words = message.split(' ');
      if (channel === '+try-failover' && promoting === undefined) {
        promoting = `${words[2]}:${words[3]}`;
        record({ t, type: 'failover', phase: 'start', server: promoting });
      } else if ((channel === '+switch-master' || channel.startsWith('-failover-abort')) && promoting !== undefined) {
        record({ t, type: 'failover', phase: 'end', server: promoting });
        promoting = undefined;
      }
    });
    await this.events.psubscribe('*');
    record({ t: now(), type: 'store', event: 'servers', detail: `master ${this.setup.master.port}, replica ${this.setup.replica!.port}` });
  }

  links(worker: string): NetworkLink[] {
    const proxies = this.proxies.get(worker);
    return proxies ? [{ name: 'sentinel', proxies }] : [];
  }

  async stop(): Promise<void> {
    this.events?.disconnect();
    for (const proxies of this.proxies.values()) for (const proxy of proxies) await proxy.close();
    for (const admin of this.admins.values()) admin.disconnect();
    await this.setup.stop();
  }
}

export function createBackend(options: unknown, waiterTimeout: number): LockBackend {
  const { sentinels, name, natMap, commandTimeout } = options as Options;
  return new RedisLockBackend({ sentinels, name, natMap }, { commandTimeout, waiterTimeout });
}
