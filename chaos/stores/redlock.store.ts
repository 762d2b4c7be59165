import type { Redis } from 'ioredis';
import { RedlockLockBackend, type LockBackend } from '../../lib/index.js';
import { ClockShift } from '../../test/support/clock-shift.js';
import { RedisServer } from '../../test/support/redis-server.js';
import { TcpProxy } from '../../test/support/tcp-proxy.js';
import type { BackendSpec, ChaosStore, FaultContext, NetworkLink, StoreFault } from '../chaos-store.interface.js';
import type { FaultKind } from '../history.js';
import { adminClient, DEBUG_ARGS, redisServerFaults } from './redis-server.faults.js';

interface Options {
  urls: string[];
}

/**
 * Three independent masters; faults: one restarted empty, one frozen, one asleep, and one whose
 * wall clock jumps forward past the lease (each master runs with an LD_PRELOAD that shifts its
 * clock; Redis expires keys by it), the scenario the debate about Redlock turns on. Each worker
 * reaches each master through a proxy of its own, one link per master: a network fault cuts or
 * slows one worker's path to one master (a minority), as between two keys of a quorum.
 */
export default class RedlockStore implements ChaosStore {
  readonly name = 'redlock';
  readonly fencing = false;
  readonly singleProcess = false;
  readonly commandTimeout = 250;
  /** No election: a master restarted or cut off answers again at once; a second to reconnect. */
  readonly recoveryMs = 1_000;
  private servers: RedisServer[] = [];
  private admins: Redis[] = [];
  private clocks: ClockShift[] = [];
  /** How far each master's clock is ahead of the real one, in ms. */
  private offsets: number[] = [];
  private victim = 0;
  private readonly proxies = new Map<string, TcpProxy[]>();
  readonly faults: Partial<Record<FaultKind, StoreFault>> = Object.fromEntries(
    Object.entries({
      ...redisServerFaults(
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

  async backendFor(worker: string): Promise<BackendSpec> {
    const proxies = await Promise.all(this.servers.map((server) => TcpProxy.start(server.port)));
    this.proxies.set(worker, proxies);
    const options: Options = { urls: proxies.map((proxy) => `redis://127.0.0.1:${proxy.port}`) };
    return { store: this.name, options };
  }

  links(worker: string): NetworkLink[] {
    return (this.proxies.get(worker) ?? []).map((proxy, i) => ({ name: `master-${i}`, proxies: [proxy] }));
  }

  async stop(): Promise<void> {
    for (const proxies of this.proxies.values()) for (const proxy of proxies) await proxy.close();
    for (const admin of this.admins) admin.disconnect();
    await Promise.all(this.servers.map((server) => server.stop()));
    for (const clock of this.clocks) clock.remove();
  }
}

export function createBackend(options: unknown): LockBackend {
  return new RedlockLockBackend((options as Options).urls);
}
