import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { freePort } from './redis-server.js';
import { until } from './wait.js';

/** Child processes run without blocking: a chaos run starts a server beside another run whose proxies live in this process. */
const run = promisify(execFile);

export interface PostgresServerOptions {
  /**
   * Keep `synchronous_commit` on, so a commit the server acknowledged survives a crash of the
   * server (not of the machine: fsync stays off). For tests that crash and restart it.
   */
  durable?: boolean;
  /** More server settings (`-c name=value`), for probes that load an extension such as pg_stat_statements. */
  settings?: Record<string, string>;
}

/**
 * A PostgreSQL cluster of the test's own: a fresh `initdb` in a temp dir, a `postgres` on a free
 * port of 127.0.0.1, trust auth, nothing shared with the machine's own server on 5432.
 * Durability is switched off (fsync, synchronous_commit unless `durable`): the cluster is thrown
 * away after.
 */
export class PostgresServer {
  private child: ChildProcess | undefined;
  private databases = 0;

  private constructor(
    readonly port: number,
    private readonly dir: string,
    private readonly bin: string,
    private readonly user: { uid: number; gid: number } | undefined,
    private readonly durable: boolean,
    private readonly settings: Record<string, string> = {},
  ) {}

  static async start(options: PostgresServerOptions = {}): Promise<PostgresServer> {
    const bin = postgresBinDir();
    // initdb and postgres refuse to run as root: run them as the `postgres` system user, in a
    // temp dir that user owns.
    const user = process.getuid?.() === 0 ? systemUser('postgres') : undefined;
    const dir = mkdtempSync(join(tmpdir(), 'ndl-postgres-'));
    if (user) chownSync(dir, user.uid, user.gid);
    const server = new PostgresServer(await freePort(), dir, bin, user, options.durable ?? false, options.settings);
    try {
      await run(
        join(bin, 'initdb'),
        ['-D', server.dataDir, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--no-sync', '--no-instructions'],
        { uid: user?.uid, gid: user?.gid },
      );
      await server.launch();
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  /**
   * A streaming replica of `primary`, asynchronous as streaming replication is by default: a
   * `pg_basebackup` of it (run as the `postgres` user, as initdb is) in a temp dir, started on a
   * free port as a hot standby that follows it. `primary` must be durable (a commit is sent to the
   * replica once it is flushed locally).
   */
  static async startReplica(primary: PostgresServer): Promise<PostgresServer> {
    const user = process.getuid?.() === 0 ? systemUser('postgres') : undefined;
    const dir = mkdtempSync(join(tmpdir(), 'ndl-postgres-replica-'));
    if (user) chownSync(dir, user.uid, user.gid);
    const replica = new PostgresServer(await freePort(), dir, primary.bin, user, true);
    try {
      // -R writes standby.signal and the primary's address; -X stream copies the WAL written meanwhile.
      await run(
        join(primary.bin, 'pg_basebackup'),
        [
          '-h',
          '127.0.0.1',
          '-p',
          String(primary.port),
          '-U',
          'postgres',
          '-D',
          replica.dataDir,
          '-R',
          '-X',
          'stream',
          '-c',
          'fast',
          '--no-sync',
        ],
        { uid: user?.uid, gid: user?.gid },
      );
      await replica.launch();
    } catch (error) {
      await replica.stop();
      throw error;
    }
    return replica;
  }

  /** A client on this server's database `database` (default the maintenance one), connected. */
  async connect(database = 'postgres'): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:${this.port}/${database}` });
    await client.connect();
    return client;
  }

  /**
   * This replica stops receiving WAL from its primary, as when the link between them fails: it
   * keeps what it has replayed and serves reads. Resolves once its WAL receiver has stopped.
   */
  async stopFollowing(): Promise<void> {
    const client = await this.connect();
    try {
      await client.query("ALTER SYSTEM SET primary_conninfo = ''");
      await client.query('SELECT pg_reload_conf()');
      await until(
        async () => (await client.query('SELECT count(*)::int AS n FROM pg_stat_wal_receiver')).rows[0].n === 0,
        20_000,
        `the WAL receiver of the replica on port ${this.port} to stop`,
      );
    } finally {
      await client.end();
    }
  }

  /** Resolves once this replica has replayed everything `primary` had written when it was called. */
  async catchUpWith(primary: PostgresServer): Promise<void> {
    const [source, client] = [await primary.connect(), await this.connect()];
    try {
      const { lsn } = (await source.query<{ lsn: string }>('SELECT pg_current_wal_flush_lsn()::text AS lsn')).rows[0];
      await until(
        async () =>
          (await client.query<{ behind: boolean }>('SELECT pg_last_wal_replay_lsn() < $1::pg_lsn AS behind', [lsn])).rows[0].behind ===
          false,
        20_000,
        `the replica on port ${this.port} to replay the primary's WAL up to ${lsn}`,
      );
    } finally {
      await Promise.all([source.end(), client.end()]);
    }
  }

  /** Promotes this replica to a primary (pg_promote), and resolves once it accepts writes. */
  async promote(): Promise<void> {
    const client = await this.connect();
    try {
      const { promoted } = (await client.query<{ promoted: boolean }>('SELECT pg_promote(true, 30) AS promoted')).rows[0];
      if (!promoted) throw new Error(`The replica on port ${this.port} was not promoted within 30 s.`);
    } finally {
      await client.end();
    }
  }

  /**
   * Connections of `role` over TCP must give its password (scram-sha-256), where every other role
   * is trusted: for tests of refused credentials. The role must exist. Resolves once the server has
   * reloaded its rules.
   */
  async requirePassword(role: string): Promise<void> {
    const file = join(this.dataDir, 'pg_hba.conf');
    // The first matching line wins: this one goes before the trust lines.
    writeFileSync(file, `host all ${role} 127.0.0.1/32 scram-sha-256\n${readFileSync(file, 'utf8')}`);
    const client = await this.connect();
    try {
      await client.query('SELECT pg_reload_conf()');
      // Until the server has reloaded, the role still connects without its password.
      const trusted = async () => {
        const probe = new pg.Client({ connectionString: `postgres://${role}@127.0.0.1:${this.port}/postgres` });
        try {
          await probe.connect();
          return true;
        } catch {
          return false;
        } finally {
          await probe.end().catch(() => undefined);
        }
      };
      await until(async () => !(await trusted()), 20_000, `the server on port ${this.port} to read pg_hba.conf again`);
    } finally {
      await client.end();
    }
  }

  private get dataDir(): string {
    return join(this.dir, 'data');
  }

  /** The server's own maintenance database; use `createDatabase()` for a test's data. */
  get url(): string {
    return `postgres://postgres@127.0.0.1:${this.port}/postgres`;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** A new, empty database on this server, and its URL. */
  async createDatabase(prefix = 'shop'): Promise<string> {
    const name = `${prefix}_${process.pid}_${++this.databases}`;
    const client = new pg.Client({ connectionString: this.url });
    await client.connect();
    try {
      await client.query(`CREATE DATABASE ${name}`);
    } finally {
      await client.end();
    }
    return `postgres://postgres@127.0.0.1:${this.port}/${name}`;
  }

  async stop(): Promise<void> {
    await this.crash();
    await rm(this.dir, { recursive: true, force: true });
  }

  /**
   * Stops the server at once, as a crash would (SIGQUIT: immediate shutdown, no checkpoint; the
   * next start recovers from the WAL). The data stays for `restart()`.
   */
  async crash(): Promise<void> {
    const child = this.child;
    this.child = undefined;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      child.kill('SIGQUIT');
      await exited;
    }
  }

  /** Starts the server again on the same port with the same data (after `crash()`, or crashes it first). */
  async restart(): Promise<void> {
    await this.crash();
    await this.launch();
  }

  private async launch(): Promise<void> {
    const child = spawn(
      join(this.bin, 'postgres'),
      [
        '-D',
        this.dataDir,
        '-p',
        String(this.port),
        '-c',
        'listen_addresses=127.0.0.1',
        '-c',
        `unix_socket_directories=${this.dir}`,
        '-c',
        'fsync=off',
        '-c',
        `synchronous_commit=${this.durable ? 'on' : 'off'}`,
        '-c',
        'full_page_writes=off',
        '-c',
        'max_connections=200',
        ...Object.entries(this.settings).flatMap(([name, value]) => ['-c', `${name}=${value}`]),
      ],
      { stdio: ['ignore', 'pipe', 'pipe'], uid: this.user?.uid, gid: this.user?.gid },
    );
    this.child = child;
    let output = '';
    child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<never>((_, reject) =>
      child.once('exit', (code) => reject(new Error(`postgres on port ${this.port} exited (${code}) before it was ready:\n${output}`))),
    );
    await Promise.race([waitForConnection(this.url, 20_000), exited]);
    child.stdout!.removeAllListeners('data').destroy();
    child.stderr!.removeAllListeners('data').destroy();
    exited.catch(() => undefined);
  }
}

/** Debian keeps server binaries out of PATH, one folder per major version; the newest wins. */
function postgresBinDir(): string {
  if (process.env.PG_BIN) return process.env.PG_BIN;
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root) ? readdirSync(root).filter((v) => existsSync(join(root, v, 'bin', 'initdb'))) : [];
  if (versions.length === 0) {
    throw new Error('No PostgreSQL server binaries in /usr/lib/postgresql/<version>/bin: apt-get install postgresql (or set PG_BIN).');
  }
  versions.sort((a, b) => Number(b) - Number(a));
  return join(root, versions[0], 'bin');
}

/** The uid and gid of a system user (`postgres`), to run a server as when the tests run as root. */
export function systemUser(name: string): { uid: number; gid: number } {
  const line = readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`${name}:`));
  if (!line) throw new Error(`Running as root, and there is no '${name}' system user to run PostgreSQL as.`);
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
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
      if (Date.now() > deadline) throw new Error(`postgres at ${url} did not accept connections within ${timeoutMs} ms: ${String(error)}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}
