import { Redis } from 'ioredis';
import { RedisServer } from './redis-server.js';
import { until } from './wait.js';

/**
 * A Sentinel setup of the test's own: one master and one sentinel (redis-server in sentinel mode)
 * monitoring it with quorum 1. Ready once the sentinel reports the master up, so a client that
 * asks the sentinel for the master gets an address that answers.
 */
export class RedisSentinel {
  private constructor(
    readonly name: string,
    readonly master: RedisServer,
    readonly sentinel: RedisServer,
  ) {}

  static async start(options: { name?: string; timeoutMs?: number } = {}): Promise<RedisSentinel> {
    const name = options.name ?? 'mymaster';
    const master = await RedisServer.start();
    let sentinel: RedisServer | undefined;
    try {
      // The monitor line can only come from a config file, which the sentinel rewrites as it runs.
      sentinel = await RedisServer.start({ config: `sentinel monitor ${name} 127.0.0.1 ${master.port} 1\n`, args: ['--sentinel'] });
      const setup = new RedisSentinel(name, master, sentinel);
      await setup.untilMasterUp(options.timeoutMs ?? 10_000);
      return setup;
    } catch (error) {
      await Promise.all([master.stop(), sentinel?.stop()]);
      throw error;
    }
  }

  /** For `new Redis({ sentinels, name })` or `new RedisLockBackend({ sentinels, name })`. */
  get sentinels(): { host: string; port: number }[] {
    return [{ host: '127.0.0.1', port: this.sentinel.port }];
  }

  async stop(): Promise<void> {
    await Promise.all([this.sentinel.stop(), this.master.stop()]);
  }

  private async untilMasterUp(timeoutMs: number): Promise<void> {
    const admin = new Redis(this.sentinel.port, '127.0.0.1', { maxRetriesPerRequest: 1 });
    try {
      await until(
        async () => {
          const fields = (await admin.call('SENTINEL', 'MASTER', this.name)) as string[];
          const flags = fields[fields.indexOf('flags') + 1];
          // Plain 'master': connected, and neither subjectively nor objectively down.
          return flags === 'master' && fields[fields.indexOf('port') + 1] === String(this.master.port);
        },
        timeoutMs,
        `the sentinel to see master ${this.name} up`,
      );
    } finally {
      admin.disconnect();
    }
  }
}
