import { Redis } from 'ioredis';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ClockShift } from '../test/support/clock-shift.js';
import { RedisSentinel } from '../test/support/redis-sentinel.js';
import { RedisServer } from '../test/support/redis-server.js';
import type { BackendSpec } from './chaos.worker.js';
import { now, type FaultKind, type HistoryEvent } from './history.js';
import { ChaosProxy } from './tcp-proxy.js';

/** What a fault on the store side needs: a random number and the run's ttl. */
export interface FaultContext {
  next: () => number;
  ttl: number;
}

/** A fault the store adapter injects: runs it to its end and returns its target. */
export type StoreFault = (context: FaultContext) => Promise<string>;

/**
 * One backend under test: the servers it needs, what each worker connects to, and the faults the
 * store side can suffer. A new backend plugs in by implementing this.
 */
export interface ChaosStore {
  readonly name: string;
  /** Whether its locks carry fencing tokens. */
  readonly fencing: boolean;
  /** All workers in one process (several services of one in-memory backend). */
  readonly singleProcess: boolean;
  /** Longest a single backend call may take before it fails; part of a wait's bound. */
  readonly commandTimeout: number;
  readonly faults: Partial<Record<FaultKind, StoreFault>>;
  start(): Promise<void>;
  backendFor(worker: string): Promise<BackendSpec>;
  /** The proxy between a worker and the store, where there is one. */
  proxyOf(worker: string): ChaosProxy | undefined;
  /** Records what the store's own monitor reports (Sentinel's events) until stop(). */
  observe?(record: (event: HistoryEvent) => void): Promise<void>;
  stop(): Promise<void>;
}

const commandTimeout = 500;

/** A client of the harness to a server it restarts: its connection errors are expected. */
function adminClient(port: number): Redis {
  return new Redis(port, '127.0.0.1', { maxRetriesPerRequest: null }).on('error', () => undefined);
}

/** Faults of one redis-server the harness owns: restarts, stalls and freezes. */
function serverFaults(server: () => RedisServer, admin: () => Redis, name: string): Partial<Record<FaultKind, StoreFault>> {
  return {
    'restart-store-empty': async () => {
      rmSync(join(server().dir, 'dump.rdb'), { force: true });
      await server().restart();
      return name;
    },
    'restart-store-snapshot': async ({ next, ttl }) => {
      await admin().call('SAVE');
      // Locks taken after the snapshot are the ones the restart forgets.
      await sleep(Math.floor(next() * ttl));
      await server().restart();
      return name;
    },
    'store-sleep': async ({ next, ttl }) => {
      const seconds = (0.2 + next() * 1.5 * (ttl / 1000)).toFixed(2);
      await admin()
        .call('DEBUG', 'SLEEP', seconds)
        .catch(() => undefined);
      return name;
    },
    'pause-store': async ({ next, ttl }) => {
      server().pause();
      await sleep(100 + Math.floor(next() * ttl * 1.5));
      server().resume();
      return name;
    },
  };
}

const DEBUG_ARGS = ['--enable-debug-command', 'yes'];

/** One standalone redis-server; each worker reaches it through a proxy of its own. */
export class RedisStore implements ChaosStore {
  readonly name = 'redis';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = commandTimeout;
  private server!: RedisServer;
  private admin!: Redis;
  private readonly proxies = new Map<string, ChaosProxy>();
  readonly faults = serverFaults(
    () => this.server,
    () => this.admin,
    'redis',
  );

  async start(): Promise<void> {
    this.server = await RedisServer.start({ args: DEBUG_ARGS });
    this.admin = adminClient(this.server.port);
  }

  async backendFor(worker: string): Promise<BackendSpec> {
    let proxy = this.proxies.get(worker);
    if (!proxy) this.proxies.set(worker, (proxy = await ChaosProxy.start(this.server.port)));
    return { kind: 'redis', url: `redis://127.0.0.1:${proxy.port}`, commandTimeout };
  }

  proxyOf(worker: string): ChaosProxy | undefined {
    return this.proxies.get(worker);
  }

  async stop(): Promise<void> {
    this.admin.disconnect();
    for (const proxy of this.proxies.values()) await proxy.close();
    await this.server.stop();
  }
}

/** The in-memory backend: every service in one process, the only fault a stalled event loop. */
export class MemoryStore implements ChaosStore {
  readonly name = 'memory';
  readonly fencing = true;
  readonly singleProcess = true;
  readonly commandTimeout = 0;
  readonly faults = {};
  async start(): Promise<void> {}
  async backendFor(): Promise<BackendSpec> {
    return { kind: 'memory', services: 5 };
  }
  proxyOf(): undefined {
    return undefined;
  }
  async stop(): Promise<void> {}
}

/**
 * A master, a replica and a sentinel; workers ask the sentinel for the master. Faults: restarts,
 * stalls and freezes of whichever server the sentinel names master at the time (a freeze longer
 * than `down-after-milliseconds` makes the sentinel fail over by itself), and a failover to the
 * replica (SENTINEL FAILOVER). The sentinel's own events go into the history; its failovers,
 * whoever caused them, become `failover` windows there (see observe()).
 */
export class SentinelStore implements ChaosStore {
  readonly name = 'sentinel';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = commandTimeout;
  private setup!: RedisSentinel;
  private readonly admins = new Map<RedisServer, Redis>();
  private victim!: RedisServer;
  private events: Redis | undefined;
  readonly faults: Partial<Record<FaultKind, StoreFault>> = {
    ...Object.fromEntries(
      Object.entries(
        serverFaults(
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
      const sentinel = new Redis(this.setup.sentinel.port, '127.0.0.1');
      try {
        await sentinel.call('SENTINEL', 'FAILOVER', this.setup.name).catch(() => undefined);
        await sleep(2_000);
      } finally {
        sentinel.disconnect();
      }
      return 'sentinel';
    },
  };

  async start(): Promise<void> {
    this.setup = await RedisSentinel.start({ replica: true, downAfterMs: 1_000 });
    for (const server of [this.setup.master, this.setup.replica!]) this.admins.set(server, adminClient(server.port));
    // DEBUG is refused unless enabled at start; the sentinel helper starts servers without it.
    delete this.faults['store-sleep'];
  }

  async backendFor(): Promise<BackendSpec> {
    return { kind: 'sentinel', sentinels: this.setup.sentinels, name: this.setup.name, commandTimeout };
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

  proxyOf(): undefined {
    return undefined;
  }

  async stop(): Promise<void> {
    this.events?.disconnect();
    for (const admin of this.admins.values()) admin.disconnect();
    await this.setup.stop();
  }
}

/**
 * Three independent masters; faults: one restarted empty, one frozen, one asleep, and one whose
 * wall clock jumps forward past the lease (each master runs with an LD_PRELOAD that shifts its
 * clock; Redis expires keys by it), the scenario the debate about Redlock turns on.
 */
export class RedlockStore implements ChaosStore {
  readonly name = 'redlock';
  readonly fencing = false;
  readonly singleProcess = false;
  readonly commandTimeout = 250;
  private servers: RedisServer[] = [];
  private admins: Redis[] = [];
  private clocks: ClockShift[] = [];
  /** How far each master's clock is ahead of the real one, in ms. */
  private offsets: number[] = [];
  private victim = 0;
  readonly faults: Partial<Record<FaultKind, StoreFault>> = Object.fromEntries(
    Object.entries({
      ...serverFaults(
        () => this.servers[this.victim],
        () => this.admins[this.victim],
        'master',
      ),
      'clock-jump': async ({ ttl }: FaultContext): Promise<string> => {
        // Forward, as an NTP step does: keys on that master expire at once. Never back, so the
        // next jump starts from where this one left the clock.
        this.offsets[this.victim] += 2 * ttl;
        this.clocks[this.victim].set(this.offsets[this.victim]);
        return 'master';
      },
    }).map(([kind, fault]) => [
      kind,
      async (context: FaultContext) => {
        this.victim = Math.floor(context.next() * this.servers.length);
        await fault(context);
        return `master-${this.victim}`;
      },
    ]),
  );

  async start(): Promise<void> {
    for (let i = 0; i < 3; i++) {
      const clock = ClockShift.compile();
      this.clocks.push(clock);
      this.offsets.push(0);
      const server = await RedisServer.start({ args: DEBUG_ARGS, env: clock.env });
      this.servers.push(server);
      this.admins.push(adminClient(server.port));
    }
  }

  async backendFor(): Promise<BackendSpec> {
    return { kind: 'redlock', urls: this.servers.map((server) => server.url) };
  }

  proxyOf(): undefined {
    return undefined;
  }

  async stop(): Promise<void> {
    for (const admin of this.admins) admin.disconnect();
    await Promise.all(this.servers.map((server) => server.stop()));
    for (const clock of this.clocks) clock.remove();
  }
}

export const STORES: Record<string, () => ChaosStore> = {
  memory: () => new MemoryStore(),
  redis: () => new RedisStore(),
  sentinel: () => new SentinelStore(),
  redlock: () => new RedlockStore(),
};
