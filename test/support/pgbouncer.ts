import { spawn, type ChildProcess } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { systemUser } from './postgres-server.js';
import { freePort } from './redis-server.js';

/**
 * A pgbouncer of the test's own in front of a test PostgreSQL: transaction pooling (each
 * transaction may run on another server connection), on a free port of 127.0.0.1, trust auth.
 * Debian's `pgbouncer` package; it refuses to run as root, so it runs as the `postgres` user.
 */
export class PgBouncer {
  private constructor(
    readonly port: number,
    private readonly dir: string,
    private child: ChildProcess | undefined,
  ) {}

  static async start(postgresPort: number, options: { poolSize?: number } = {}): Promise<PgBouncer> {
    const user = process.getuid?.() === 0 ? systemUser('postgres') : undefined;
    const dir = mkdtempSync(join(tmpdir(), 'ndl-pgbouncer-'));
    if (user) chownSync(dir, user.uid, user.gid);
    const port = await freePort();
    writeFileSync(join(dir, 'userlist.txt'), '"postgres" ""\n"app_user" ""\n');
    writeFileSync(
      join(dir, 'pgbouncer.ini'),
      [
        '[databases]',
        `* = host=127.0.0.1 port=${postgresPort}`,
        '[pgbouncer]',
        'listen_addr = 127.0.0.1',
        `listen_port = ${port}`,
        'unix_socket_dir =',
        'auth_type = trust',
        `auth_file = ${join(dir, 'userlist.txt')}`,
        'pool_mode = transaction',
        'max_client_conn = 1000',
        `default_pool_size = ${options.poolSize ?? 20}`,
        'ignore_startup_parameters = extra_float_digits',
        '',
      ].join('\n'),
    );
    // Debian installs it in /usr/sbin, which is not on every user's PATH.
    const child = spawn(existsSync('/usr/sbin/pgbouncer') ? '/usr/sbin/pgbouncer' : 'pgbouncer', [join(dir, 'pgbouncer.ini')], {
      stdio: ['ignore', 'pipe', 'pipe'],
      uid: user?.uid,
      gid: user?.gid,
    });
    const bouncer = new PgBouncer(port, dir, child);
    let output = '';
    child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<never>((_, reject) =>
      child.once('exit', (code) => reject(new Error(`pgbouncer on port ${port} exited (${code}) before it was ready:\n${output}`))),
    );
    try {
      await Promise.race([waitForConnection(bouncer.url('postgres'), 10_000), exited]);
    } catch (error) {
      await bouncer.stop();
      throw error;
    }
    exited.catch(() => undefined);
    child.stdout!.removeAllListeners('data').resume();
    child.stderr!.removeAllListeners('data').resume();
    return bouncer;
  }

  /** The connection string of `database` through this pgbouncer. */
  url(database: string, user = 'postgres'): string {
    return `postgres://${user}@127.0.0.1:${this.port}/${database}`;
  }

  async stop(): Promise<void> {
    const child = this.child;
    this.child = undefined;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      child.kill('SIGINT'); // pgbouncer's immediate shutdown
      await exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

async function waitForConnection(url: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1_000 });
    try {
      await client.connect();
      await client.query('SELECT 1');
      await client.end();
      return;
    } catch (error) {
      await client.end().catch(() => undefined);
      if (Date.now() > deadline) throw new Error(`pgbouncer at ${url} did not accept connections within ${timeoutMs} ms: ${String(error)}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}
