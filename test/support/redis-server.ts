import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';

/** A free TCP port on 127.0.0.1, as the kernel hands it out. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A server certificate, its key and the CA that signed it, as files (see tls-certificates.ts). */
export interface RedisServerTls {
  certFile: string;
  keyFile: string;
  caFile: string;
  /**
   * Set: clients must show a certificate the CA signed (Redis's own default), and this is the one
   * the harness shows for its readiness PING. Unset: clients need none.
   */
  clientCertificate?: { cert: string; key: string };
}

/**
 * A redis-server of the test's own, on a free port, never the machine's: tests may kill, pause
 * and restart it. It keeps nothing on disk unless `persist` is set, so a restart comes back empty.
 */
export class RedisServer {
  private child: ChildProcess | undefined;
  /** Where it keeps its files (dump.rdb once SAVE ran); a restart loads what is there. */
  readonly dir = mkdtempSync(join(tmpdir(), 'ndl-redis-'));

  private constructor(
    readonly port: number,
    private readonly extraArgs: readonly string[],
    private readonly configFile: string | undefined,
    private readonly env: NodeJS.ProcessEnv | undefined,
    /** Set: the port speaks TLS only, and there is no plain one. */
    readonly tls: RedisServerTls | undefined,
  ) {}

  /**
   * `port`: a port the caller chose (a cluster node needs port + 10000 free too), else a free one.
   * `config`: the text of a config file, written to the server's own directory and passed first;
   * for settings only a file can hold (a sentinel's `sentinel monitor`, which it also rewrites).
   * `env`: added to the server's environment (e.g. an LD_PRELOAD that shifts its clock).
   * `tls`: the port speaks TLS with this certificate, and no port takes plain connections.
   */
  static async start(
    options: { args?: readonly string[]; port?: number; config?: string; env?: NodeJS.ProcessEnv; tls?: RedisServerTls } = {},
  ): Promise<RedisServer> {
    const port = options.port ?? (await freePort());
    const server = new RedisServer(
      port,
      options.args ?? [],
      options.config === undefined ? undefined : 'redis.conf',
      options.env,
      options.tls,
    );
    if (options.config !== undefined) writeFileSync(join(server.dir, 'redis.conf'), options.config);
    try {
      await server.launch();
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  get url(): string {
    return `${this.tls ? 'rediss' : 'redis'}://127.0.0.1:${this.port}`;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  get running(): boolean {
    return this.child !== undefined;
  }

  /** Kills the server outright (SIGKILL): clients see their connections drop. */
  async kill(): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.child = undefined;
    // A server that died by itself (e.g. a launch that failed) has no exit event left to wait for.
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGKILL');
    await exited;
  }

  /** Freezes the server (SIGSTOP): connections stay open and requests hang. */
  pause(): void {
    this.child?.kill('SIGSTOP');
  }

  resume(): void {
    this.child?.kill('SIGCONT');
  }

  /** Starts it again on the same port, empty. */
  async restart(): Promise<void> {
    await this.kill();
    await this.launch();
  }

  async stop(): Promise<void> {
    this.resume();
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }

  private async launch(): Promise<void> {
    const config = this.configFile === undefined ? [] : [join(this.dir, this.configFile)];
    const tls = this.tls;
    const ports = tls
      ? ['--port', '0', '--tls-port', String(this.port), '--tls-cert-file', tls.certFile, '--tls-key-file', tls.keyFile]
      : ['--port', String(this.port)];
    const child = spawn(
      'redis-server',
      [
        ...config,
        ...ports,
        ...(tls ? ['--tls-ca-cert-file', tls.caFile, '--tls-auth-clients', tls.clientCertificate ? 'yes' : 'no'] : []),
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--dir',
        this.dir,
        ...this.extraArgs,
      ],
      { stdio: ['ignore', 'pipe', 'pipe'], env: this.env && { ...process.env, ...this.env } },
    );
    this.child = child;
    let output = '';
    child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<never>((_, reject) =>
      child.once('exit', (code) => reject(new Error(`redis-server on port ${this.port} exited (${code}) before it was ready:\n${output}`))),
    );
    // The port may be taken between freePort() and the launch; that surfaces here as an exit.
    await Promise.race([waitForPing(this.port, 10_000, tls), exited]);
    // Only the launch needs the output; after it, pipes must not keep the test process alive.
    child.stdout!.removeAllListeners('data').destroy();
    child.stderr!.removeAllListeners('data').destroy();
    exited.catch(() => undefined);
  }
}

/** Polls with PING until the server answers PONG, or fails after `timeoutMs`. */
async function waitForPing(port: number, timeoutMs: number, tls: RedisServerTls | undefined): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await ping(port, tls)) return;
    if (Date.now() > deadline) throw new Error(`redis-server on port ${port} did not answer PING within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function ping(port: number, tls: RedisServerTls | undefined): Promise<boolean> {
  return new Promise((resolve) => {
    // Only whether it is up: checking its certificate is the tests' business.
    const socket = tls ? tlsConnect({ port, host: '127.0.0.1', rejectUnauthorized: false, ...tls.clientCertificate }) : new Socket();
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1_000, () => done(false));
    socket.once('error', () => done(false));
    if (tls) socket.once('secureConnect', () => socket.write('PING\r\n'));
    else socket.connect(port, '127.0.0.1', () => socket.write('PING\r\n'));
    socket.once('data', (data) => done(data.toString().startsWith('+PONG')));
  });
}
