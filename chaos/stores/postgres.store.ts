import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { PostgresLockBackend, type LockBackend } from '../../lib/index.js';
import { PostgresServer } from '../../test/support/postgres-server.js';
import { TcpProxy } from '../../test/support/tcp-proxy.js';
import type { BackendSpec, ChaosStore, NetworkLink, StoreFault } from '../chaos-store.interface.js';
import type { FaultKind } from '../history.js';

interface Options {
  url: string;
  commandTimeout: number;
}

/**
 * One PostgreSQL cluster (durable commits: a crash keeps what it acknowledged, as the guarantees
 * table assumes); each worker reaches it through a proxy of its own, its pool and its LISTEN
 * connection alike. Faults: the server crashed and restarted (recovery from the WAL), every
 * process of the cluster frozen (SIGSTOP), the lock table held by another transaction so that the
 * workers' statements queue behind it, and the network faults.
 */
export default class PostgresStore implements ChaosStore {
  readonly name = 'postgres';
  readonly fencing = true;
  readonly singleProcess = false;
  readonly commandTimeout = 1_000;
  /** No election: the server recovers from its WAL before the fault ends; a second to reconnect. */
  readonly recoveryMs = 1_000;
  private server!: PostgresServer;
  private url!: string;
  private readonly proxies = new Map<string, TcpProxy>();
  readonly faults: Partial<Record<FaultKind, StoreFault>> = {
    'restart-store': async () => {
      await this.server.restart();
      return 'postgres';
    },
    'pause-store': async ({ next, ttl }) => {
      // Each connection is a process of its own: freeze them all, the postmaster first so it
      // starts no new one meanwhile.
      const pids = [this.server.pid!, ...childrenOf(this.server.pid!)];
      for (const pid of pids) signal(pid, 'SIGSTOP');
      await sleep(100 + Math.floor(next() * ttl * 1.5));
      for (const pid of pids.reverse()) signal(pid, 'SIGCONT');
      return 'postgres';
    },
    'store-lock-stall': async ({ next, ttl }) => {
      // A migration or a long transaction holding the lock table: every statement on it waits.
      const client = new pg.Client({ connectionString: this.url });
      client.on('error', () => undefined);
      try {
        await client.connect();
        await client.query('BEGIN');
        await client.query('LOCK TABLE distributed_locks IN ACCESS EXCLUSIVE MODE');
        await sleep(100 + Math.floor(next() * ttl * 1.5));
        await client.query('ROLLBACK');
      } catch {
        // The table is made by the workers' first lock; a stall before that stalls nothing.
      } finally {
        await client.end().catch(() => undefined);
      }
      return 'postgres';
    },
  };

  async start(): Promise<void> {
    this.server = await PostgresServer.start({ durable: true });
    this.url = await this.server.createDatabase('chaos');
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
    return proxy ? [{ name: 'postgres', proxies: [proxy] }] : [];
  }

  async stop(): Promise<void> {
    for (const proxy of this.proxies.values()) await proxy.close();
    await this.server.stop();
  }
}

export function createBackend(options: unknown, waiterTimeout: number): LockBackend {
  const { url, commandTimeout } = options as Options;
  return new PostgresLockBackend(url, { commandTimeout, waiterTimeout });
}

/** The processes whose parent is `pid`, from /proc (Linux). */
function childrenOf(pid: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // The parent is the 2nd field after the command, which is in parentheses and may hold spaces.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === pid) children.push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return children;
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // Gone meanwhile.
  }
}
