import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { chownSync, mkdtempSync, readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import mysql from 'mysql2/promise';
import { systemUser } from './postgres-server.js';
import { freePort } from './redis-server.js';

/** Child processes run without blocking: a chaos run starts a server beside another run whose proxies live in this process. */
const run = promisify(execFile);

/** The user every test database grants everything on; not a server-wide administrator. */
export const MARIADB_USER = 'locks';
export const MARIADB_PASSWORD = 'locks-password';

/**
 * A MariaDB of the test's own: a fresh `mariadb-install-db` in a temp dir, a `mariadbd` on a free
 * port of 127.0.0.1 and a socket in that dir, nothing shared with the machine's own server on
 * 3306. Run as the `mysql` system user when the tests run as root (the server cannot create its
 * socket in a dir that user does not own). Commits reach the OS at once and disk once a second
 * (innodb_flush_log_at_trx_commit=2): they survive a crash of the server, not of the machine.
 */
export class MariadbServer {
  private child: ChildProcess | undefined;
  private databases = 0;

  private constructor(
    readonly port: number,
    private readonly dir: string,
    private readonly user: { uid: number; gid: number } | undefined,
    private readonly extraArgs: readonly string[],
  ) {}

  /**
   * A server with `--server-id=<id>` and a row-based binary log, for replication (see
   * `startReplica`).
   */
  static startPrimary(): Promise<MariadbServer> {
    return MariadbServer.start({ args: ['--server-id=1', '--log-bin=mysql-bin', '--binlog-format=ROW'] });
  }

  /**
   * An asynchronous replica of `primary` (MariaDB's default replication), read-only, following it
   * from its first transaction by GTID: start it before `primary` has a database of the test's own.
   */
  static async startReplica(primary: MariadbServer): Promise<MariadbServer> {
    const replica = await MariadbServer.start({ args: ['--server-id=2', '--read-only=1'] });
    try {
      const admin = await replica.connect();
      try {
        await admin.query(
          `CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = ${primary.port}, MASTER_USER = 'admin', ` +
            `MASTER_PASSWORD = 'admin', MASTER_USE_GTID = slave_pos; START SLAVE`,
        );
      } finally {
        await admin.end();
      }
    } catch (error) {
      await replica.stop();
      throw error;
    }
    return replica;
  }

  /** Resolves once this replica has applied everything `primary` had logged when it was called. */
  async catchUpWith(primary: MariadbServer): Promise<void> {
    const [source, admin] = [await primary.connect(), await this.connect()];
    try {
      const [[{ pos }]] = await source.query<mysql.RowDataPacket[]>('SELECT @@gtid_binlog_pos AS pos');
      const [[{ waited }]] = await admin.query<mysql.RowDataPacket[]>('SELECT MASTER_GTID_WAIT(?, 20) AS waited', [pos]);
      if (Number(waited) !== 0) throw new Error(`The replica on port ${this.port} did not reach ${String(pos)} within 20 s.`);
    } finally {
      await Promise.all([source.end(), admin.end()]);
    }
  }

  /** This replica stops applying what its primary logs, as when the link between them fails. */
  async stopFollowing(): Promise<void> {
    const admin = await this.connect();
    try {
      await admin.query('STOP SLAVE');
    } finally {
      await admin.end();
    }
  }

  /** Promotes this replica: it forgets its primary and takes writes. */
  async promote(): Promise<void> {
    const admin = await this.connect();
    try {
      await admin.query('STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0');
    } finally {
      await admin.end();
    }
  }

  static async start(options: { args?: readonly string[] } = {}): Promise<MariadbServer> {
    const user = process.getuid?.() === 0 ? systemUser('mysql') : undefined;
    const dir = mkdtempSync(join(tmpdir(), 'ndl-mariadb-'));
    if (user) chownSync(dir, user.uid, user.gid);
    const server = new MariadbServer(await freePort(), dir, user, options.args ?? []);
    try {
      await run(
        'mariadb-install-db',
        [
          '--no-defaults',
          `--datadir=${server.dataDir}`,
          '--skip-test-db',
          ...(user ? ['--user=mysql'] : ['--auth-root-authentication-method=normal']),
        ],
        { uid: user?.uid, gid: user?.gid },
      );
      await server.launch();
      // The administrator for tests: over TCP with a password (root has only the socket as root).
      await server.bootstrap(
        // Not in the binary log: a replica makes the same users itself.
        `SET SESSION sql_log_bin = 0; CREATE USER 'admin'@'%' IDENTIFIED BY 'admin'; GRANT ALL ON *.* TO 'admin'@'%' WITH GRANT OPTION; ` +
          `CREATE USER '${MARIADB_USER}'@'%' IDENTIFIED BY '${MARIADB_PASSWORD}';`,
      );
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  private get dataDir(): string {
    return join(this.dir, 'data');
  }

  get socket(): string {
    return join(this.dir, 'mysqld.sock');
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** The server-wide administrator's URL (every right, on every database). */
  adminUrl(database = 'mysql'): string {
    return `mysql://admin:admin@127.0.0.1:${this.port}/${database}`;
  }

  /** A connection as the administrator, on `database`. */
  connect(database = 'mysql'): Promise<mysql.Connection> {
    return mysql.createConnection({ uri: this.adminUrl(database), multipleStatements: true });
  }

  /**
   * A new, empty database on this server, on which MARIADB_USER may do anything; its URL, as
   * that user. `port` puts another port in the URL (a proxy's).
   */
  async createDatabase(prefix = 'locks', port = this.port): Promise<{ name: string; url: string }> {
    const name = `${prefix}_${process.pid}_${++this.databases}`;
    const admin = await this.connect();
    try {
      await admin.query(`CREATE DATABASE \`${name}\`; GRANT ALL ON \`${name}\`.* TO '${MARIADB_USER}'@'%'`);
    } finally {
      await admin.end();
    }
    return { name, url: `mysql://${MARIADB_USER}:${MARIADB_PASSWORD}@127.0.0.1:${port}/${name}` };
  }

  async stop(): Promise<void> {
    await this.crash();
    await rm(this.dir, { recursive: true, force: true });
  }

  /** Kills the server at once (SIGKILL: no shutdown; the next start recovers from the redo log). */
  async crash(): Promise<void> {
    const child = this.child;
    this.child = undefined;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      child.kill('SIGKILL');
      await exited;
    }
  }

  /** Starts the server again on the same port with the same data (after `crash()`, or crashes it first). */
  async restart(): Promise<void> {
    await this.crash();
    await this.launch();
  }

  /** SIGSTOP / SIGCONT of the server process: a server that stops answering without closing anything. */
  pause(): void {
    this.child?.kill('SIGSTOP');
  }

  resume(): void {
    this.child?.kill('SIGCONT');
  }

  /** Runs SQL as root over the socket, with the `mariadb` client (root may only log in there). */
  private async bootstrap(sql: string): Promise<void> {
    await run('mariadb', ['--no-defaults', `--socket=${this.socket}`, '-uroot', '-e', sql]);
  }

  private async launch(): Promise<void> {
    const child = spawn(
      'mariadbd',
      [
        '--no-defaults',
        ...(this.user ? ['--user=mysql'] : []),
        `--datadir=${this.dataDir}`,
        `--port=${this.port}`,
        '--bind-address=127.0.0.1',
        `--socket=${this.socket}`,
        `--pid-file=${join(this.dir, 'mysqld.pid')}`,
        `--log-error=${join(this.dir, 'error.log')}`,
        '--skip-name-resolve',
        '--innodb-flush-log-at-trx-commit=2',
        '--innodb-buffer-pool-size=32M',
        '--innodb-log-file-size=32M',
        '--max-connections=500',
        ...this.extraArgs,
      ],
      { stdio: ['ignore', 'ignore', 'ignore'] },
    );
    this.child = child;
    const exited = new Promise<never>((_, reject) =>
      child.once('exit', (code) =>
        reject(new Error(`mariadbd on port ${this.port} exited (${code}) before it was ready:\n${this.errorLog().slice(-3_000)}`)),
      ),
    );
    await Promise.race([waitForConnection(this.socket, 20_000), exited]);
    exited.catch(() => undefined);
  }

  private errorLog(): string {
    try {
      return readFileSync(join(this.dir, 'error.log'), 'utf8');
    } catch {
      return '';
    }
  }
}

/** Polls the socket with the `mariadb` client until the server answers. */
async function waitForConnection(socket: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await run('mariadb', ['--no-defaults', `--socket=${socket}`, '-uroot', '-e', 'SELECT 1']);
      return;
    } catch (error) {
      if (Date.now() > deadline) throw new Error(`mariadbd on ${socket} did not answer within ${timeoutMs} ms: ${String(error)}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}
