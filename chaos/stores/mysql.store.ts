import { setTimeout as sleep } from 'node:timers/promises';
import mysql from 'mysql2/promise';
import { MysqlLockBackend, type LockBackend } from '../../lib/index.js';
import { MariadbServer } from '../../test/support/mariadb-server.js';
import { TcpProxy } from '../../test/support/tcp-proxy.js';
import type { BackendSpec, ChaosStore, NetworkLink, StoreFault } from '../chaos-store.interface.js';
import type { FaultKind } from '../history.js';

interface Options {
  url: string;
  commandTimeout: number;
}

/**
 * One MariaDB (commits reach the OS at once: a kill of the server keeps what it acknowledged);
 * each worker reaches it through a proxy of its own. Faults: the server killed (-9) and started
 * again (recovery from the redo log), the server frozen (SIGSTOP), FLUSH TABLES WITH READ LOCK
 * held for a while so that every write queues behind it, and the network faults.
 */
export default class MysqlStore implements ChaosStore {
  readonly name = 'mysql';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = 1_000;
  /** No election: the server recovers from its redo log before the fault ends; a second to reconnect. */
  readonly recoveryMs = 1_000;
  private server!: MariadbServer;
  private url!: string;
  private readonly proxies = new Map<string, TcpProxy>();
  readonly faults: Partial<Record<FaultKind, StoreFault>> = {
    'restart-store': async () => {
      await this.server.restart();
      return 'mysql';
    },
    'pause-store': async ({ next, ttl }) => {
      this.server.pause();
      await sleep(100 + Math.floor(next() * ttl * 1.5));
      this.server.resume();
      return 'mysql';
    },
    'store-lock-stall': async ({ next, ttl }) => {
      // A backup or an administrator holding the global read lock: every write waits.
      const admin = await mysql.createConnection(this.server.adminUrl()).catch(() => undefined);
      if (!admin) return 'mysql';
      admin.on('error', () => undefined);
      try {
        await admin.query('FLUSH TABLES WITH READ LOCK');
        await sleep(100 + Math.floor(next() * ttl * 1.5));
        await admin.query('UNLOCK TABLES');
      } catch {
        // The server went away meanwhile: its lock went with the connection.
      } finally {
        await admin.end().catch(() => undefined);
      }
      return 'mysql';
    },
  };

  async start(): Promise<void> {
    this.server = await MariadbServer.start();
    this.url = (await this.server.createDatabase('chaos')).url;
  }

  async backendFor(worker: string): Promise<BackendSpec> {
    let proxy = this.proxies.get(worker);
    if (!proxy) this.proxies.set(worker, (proxy = await TcpProxy.start(this.server.port)));
    const url = new URL(this.url);
    url.port = String(proxy.port);
    const options: Options = { url: url.toString(), commandTimeout: this.commandTimeout };
    return { store: this.name, options };
  }

  links(worker: string): NetworkLink[] {
    const proxy = this.proxies.get(worker);
    return proxy ? [{ name: 'mysql', proxies: [proxy] }] : [];
  }

  async stop(): Promise<void> {
    for (const proxy of this.proxies.values()) await proxy.close();
    await this.server.stop();
  }
}

export function createBackend(options: unknown, waiterTimeout: number): LockBackend {
  const { url, commandTimeout } = options as Options;
  return new MysqlLockBackend(url, { commandTimeout, waiterTimeout });
}
