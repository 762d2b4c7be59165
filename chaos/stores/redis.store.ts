import type { Redis } from 'ioredis';
import { RedisLockBackend, type LockBackend } from '../../lib/index.js';
import { RedisServer } from '../../test/support/redis-server.js';
import { TcpProxy } from '../../test/support/tcp-proxy.js';
import type { BackendSpec, ChaosStore, NetworkLink } from '../chaos-store.interface.js';
import { adminClient, DEBUG_ARGS, REDIS_COMMAND_TIMEOUT, redisServerFaults } from './redis-server.faults.js';

interface Options {
  url: string;
  commandTimeout: number;
}

/** One standalone redis-server; each worker reaches it through a proxy of its own. */
export default class RedisStore implements ChaosStore {
  readonly name = 'redis';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = REDIS_COMMAND_TIMEOUT;
  /** No election: a restarted server answers again at once; a second for every client to reconnect. */
  readonly recoveryMs = 1_000;
  private server!: RedisServer;
  private admin!: Redis;
  private readonly proxies = new Map<string, TcpProxy>();
  readonly faults = redisServerFaults(
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
    if (!proxy) this.proxies.set(worker, (proxy = await TcpProxy.start(this.server.port)));
    const options: Options = { url: `redis://127.0.0.1:${proxy.port}`, commandTimeout: this.commandTimeout };
    return { store: this.name, options };
  }

  links(worker: string): NetworkLink[] {
    const proxy = this.proxies.get(worker);
    return proxy ? [{ name: 'redis', proxies: [proxy] }] : [];
  }

  async stop(): Promise<void> {
    this.admin.disconnect();
    for (const proxy of this.proxies.values()) await proxy.close();
    await this.server.stop();
  }
}

export function createBackend(options: unknown, waiterTimeout: number): LockBackend {
  const { url, commandTimeout } = options as Options;
  return new RedisLockBackend(url, { commandTimeout, waiterTimeout });
}
