import { Redis } from 'ioredis';
import { RedisServer } from './redis-server.js';
import { until } from './wait.js';

/**
 * A Sentinel setup of the test's own: one master, optionally one replica of it, and one sentinel
 * (redis-server in sentinel mode) monitoring it with quorum 1. Ready once the sentinel reports the
 * master up (and knows the replica), so a client that asks the sentinel for the master gets an
 * address that answers. `master` and `replica` are the servers as they started; after a failover
 * `currentMaster()` says which one the sentinel names.
 */
export class RedisSentinel {
  private constructor(
    readonly name: string,
    readonly master: RedisServer,
    readonly sentinel: RedisServer,
    readonly replica: RedisServer | undefined,
  ) {}

  /**
   * `replica`: start a replica too, for failovers. `downAfterMs`: how long the master must be
   * silent before the sentinel fails over to the replica (the sentinel's own default is 30 s).
   */
  static async start(options: { name?: string; timeoutMs?: number; replica?: boolean; downAfterMs?: number } = {}): Promise<RedisSentinel> {
    const name = options.name ?? 'mymaster';
    const timeoutMs = options.timeoutMs ?? 10_000;
    // Roles live in config files, which the sentinel rewrites (CONFIG REWRITE) when it promotes or
    // demotes a server: a server restarted after a failover comes back in its current role, as a
    // deployed one does, not in the role it started with.
    const master = await RedisServer.start({ config: '' });
    let replica: RedisServer | undefined;
    let sentinel: RedisServer | undefined;
    try {
      if (options.replica) {
        replica = await RedisServer.start({ config: `replicaof 127.0.0.1 ${master.port}\n` });
        // Before the sentinel starts: its first look at the master then lists the replica.
        await untilReplicaOnline(master, timeoutMs);
      }
      // The monitor lines can only come from a config file, which the sentinel rewrites as it runs.
      const config = [
        `sentinel monitor ${name} 127.0.0.1 ${master.port} 1`,
        ...(options.downAfterMs === undefined
          ? []
          : [
              `sentinel down-after-milliseconds ${name} ${options.downAfterMs}`,
              `sentinel failover-timeout ${name} ${options.downAfterMs * 4}`,
            ]),
      ];
      sentinel = await RedisServer.start({ config: `${config.join('\n')}\n`, args: ['--sentinel'] });
      const setup = new RedisSentinel(name, master, sentinel, replica);
      await setup.untilMasterIs(master.port, timeoutMs, replica ? 1 : 0);
      return setup;
    } catch (error) {
      await Promise.all([master.stop(), replica?.stop(), sentinel?.stop()]);
      throw error;
    }
  }

  /** For `new Redis({ sentinels, name })` or `new RedisLockBackend({ sentinels, name })`. */
  get sentinels(): { host: string; port: number }[] {
    return [{ host: '127.0.0.1', port: this.sentinel.port }];
  }

  /** The server the sentinel names as the master now (the original replica after a failover). */
  async currentMaster(): Promise<RedisServer> {
    const admin = new Redis(this.sentinel.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
    try {
      const [, port] = (await admin.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', this.name)) as [string, string];
      return this.replica?.port === Number(port) ? this.replica : this.master;
    } finally {
      admin.disconnect();
    }
  }

  /** Waits until the sentinel names the server on `port` as the master (after a failover, say). */
  async untilMasterIs(port: number, timeoutMs: number, replicas = 0): Promise<void> {
    const admin = new Redis(this.sentinel.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
    try {
      await until(
        async () => {
          const fields = (await admin.call('SENTINEL', 'MASTER', this.name)) as string[];
          const field = (name: string) => fields[fields.indexOf(name) + 1];
          // Plain 'master': connected, and neither subjectively nor objectively down.
          return field('flags') === 'master' && field('port') === String(port) && Number(field('num-slaves')) >= replicas;
        },
        timeoutMs,
        `the sentinel to see master ${this.name} up on port ${port}`,
      );
    } finally {
      admin.disconnect();
    }
  }

  async stop(): Promise<void> {
    await Promise.all([this.sentinel.stop(), this.master.stop(), this.replica?.stop()]);
  }
}

async function untilReplicaOnline(master: RedisServer, timeoutMs: number): Promise<void> {
  const admin = new Redis(master.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
  try {
    await until(async () => /slave0:.*state=online/.test(await admin.info('replication')), timeoutMs, 'the replica to be online');
  } finally {
    admin.disconnect();
  }
}
