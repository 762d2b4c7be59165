import { Redis, type RedisOptions } from 'ioredis';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import type { RedlockLockBackendOptions } from '../../../lib/backends/redlock/redlock.options.js';
import { RedisServer } from '../../support/redis-server.js';

/**
 * Independent redis-servers of the test's own, and the ioredis clients opened on them (closed by
 * `disconnect()`: the backend leaves clients it was given open, as users expect).
 */
export class RedlockMasters {
  private readonly clients = new Set<Redis>();

  private constructor(readonly servers: RedisServer[]) {}

  /** `options(i)`: how to start the i-th server (e.g. with its clock shifted). */
  static async start(count: number, options: (i: number) => Parameters<typeof RedisServer.start>[0] = () => ({})): Promise<RedlockMasters> {
    return new RedlockMasters(await Promise.all(Array.from({ length: count }, (_, i) => RedisServer.start(options(i)))));
  }

  urls(): string[] {
    return this.servers.map((server) => server.url);
  }

  /** A client per master, as another process would open them. */
  connect(options: RedisOptions = {}): Redis[] {
    return this.servers.map((server) => this.client(server, options));
  }

  /** A client to one master, closed with the others. */
  client(server: RedisServer, options: RedisOptions = {}): Redis {
    // Fail fast while a killed master is down, and keep reconnecting quickly for restart tests.
    // disconnect() of a client whose master was killed waits disconnectTimeout (2 s by default)
    // for a socket that already closed, keeping Jest from exiting: a short one ends it.
    const client = new Redis(server.port, '127.0.0.1', {
      maxRetriesPerRequest: 1,
      retryStrategy: () => 50,
      disconnectTimeout: 100,
      ...options,
    });
    client.on('error', () => undefined);
    this.clients.add(client);
    return client;
  }

  backend(options: Omit<RedlockLockBackendOptions, 'clients'> = {}): RedlockLockBackend {
    // Generous per-master timeout: on a loaded test machine 250 ms can pass without a dead master.
    return new RedlockLockBackend({ clients: this.connect(), masterTimeout: 2_000, ...options });
  }

  /** Number of keys on each master (a killed one reports -1). */
  async keyCounts(): Promise<number[]> {
    return Promise.all(
      this.servers.map(async (server) => {
        if (!server.running) return -1;
        const client = new Redis(server.port, '127.0.0.1', { lazyConnect: true, maxRetriesPerRequest: 0 });
        try {
          await client.connect();
          return await client.dbsize();
        } finally {
          client.disconnect();
        }
      }),
    );
  }

  async flush(): Promise<void> {
    await Promise.all(
      this.servers
        .filter((server) => server.running)
        .map(async (server) => {
          const client = new Redis(server.port, '127.0.0.1', { lazyConnect: true, maxRetriesPerRequest: 0 });
          try {
            await client.connect();
            await client.flushall();
          } finally {
            client.disconnect();
          }
        }),
    );
  }

  disconnect(): void {
    for (const client of this.clients) client.disconnect();
    this.clients.clear();
  }

  async stop(): Promise<void> {
    this.disconnect();
    await Promise.all(this.servers.map((server) => server.stop()));
  }
}
