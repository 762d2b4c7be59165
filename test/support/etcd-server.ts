import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { freePort } from './redis-server.js';
import { until } from './wait.js';

/** One member of an EtcdCluster: its own ports, data dir and process. */
export class EtcdMember {
  private child: ChildProcess | undefined;
  private paused = false;

  constructor(
    readonly name: string,
    readonly clientPort: number,
    readonly peerPort: number,
    readonly dataDir: string,
    /** The same for every member of one cluster, and different from any other cluster's. */
    private readonly clusterToken: string,
  ) {}

  /** What a client connects to. */
  get endpoint(): string {
    return `http://127.0.0.1:${this.clientPort}`;
  }

  get peerUrl(): string {
    return `http://127.0.0.1:${this.peerPort}`;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  get running(): boolean {
    return this.child !== undefined;
  }

  /** Starts the process; `initialCluster` lists every member's peer URL (name=url,...). */
  launch(initialCluster: string, state: 'new' | 'existing'): void {
    const child = spawn(
      'etcd',
      [
        '--name',
        this.name,
        '--data-dir',
        this.dataDir,
        '--listen-client-urls',
        this.endpoint,
        '--advertise-client-urls',
        this.endpoint,
        // Without them it binds the default peer port 2380, which another cluster may hold.
        '--listen-peer-urls',
        this.peerUrl,
        '--initial-advertise-peer-urls',
        this.peerUrl,
        '--initial-cluster',
        initialCluster,
        '--initial-cluster-state',
        state,
        '--initial-cluster-token',
        this.clusterToken,
        // Throwaway data: no fsync, which a loaded CI disk would make slow and uneven.
        '--unsafe-no-fsync',
        '--logger',
        'zap',
        '--log-level',
        'error',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    this.child = child;
    this.paused = false;
    let output = '';
    const collect = (chunk: Buffer) => void (output = (output + chunk.toString()).slice(-4_000));
    child.stderr!.on('data', collect);
    child.once('exit', (code, signal) => {
      if (this.child === child) this.child = undefined;
      if (code !== 0 && signal === null && output) process.stderr.write(`etcd ${this.name} exited (${code}):\n${output}\n`);
    });
  }

  /** Only the launch needs the output; after it, the pipe must not keep the test process alive. */
  quiet(): void {
    this.child?.stderr?.removeAllListeners('data').destroy();
  }

  /** SIGKILL: no goodbye to its peers or clients; its data stays for `restart()`. */
  async kill(): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.child = undefined;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    if (this.paused) child.kill('SIGCONT');
    child.kill('SIGKILL');
    await exited;
  }

  /** SIGSTOP: connections stay open, nothing is answered, its peers stop hearing from it. */
  pause(): void {
    if (!this.child || this.paused) return;
    this.child.kill('SIGSTOP');
    this.paused = true;
  }

  resume(): void {
    if (!this.child || !this.paused) return;
    this.child.kill('SIGCONT');
    this.paused = false;
  }

  /** The member's own view: its id, the leader's id, its raft index. Undefined when it does not answer. */
  async status(timeoutMs = 1_000): Promise<{ memberId: string; leader: string; raftIndex: number } | undefined> {
    try {
      const response = await fetch(`${this.endpoint}/v3/maintenance/status`, {
        method: 'POST',
        body: '{}',
        signal: AbortSignal.timeout(timeoutMs),
      });
      const body = (await response.json()) as { header?: { member_id?: string }; leader?: string; raftIndex?: string };
      if (!body.header?.member_id) return undefined;
      return { memberId: body.header.member_id, leader: body.leader ?? '0', raftIndex: Number(body.raftIndex ?? 0) };
    } catch {
      return undefined;
    }
  }

  /** Whether it answers a linearizable read: it is up and sees a leader with a quorum. */
  async healthy(timeoutMs = 1_000): Promise<boolean> {
    try {
      const response = await fetch(`${this.endpoint}/health`, { signal: AbortSignal.timeout(timeoutMs) });
      return ((await response.json()) as { health?: string }).health === 'true';
    } catch {
      return false;
    }
  }
}

/**
 * An etcd cluster of the test's own: 1 or 3 (or more) members on free loopback ports (client and
 * peer), each with a temp data dir, never the default ports 2379/2380. Tests may kill, pause and
 * restart members. Durability is off (`--unsafe-no-fsync`): the data is thrown away after.
 */
export class EtcdCluster {
  private constructor(
    readonly members: EtcdMember[],
    private readonly dir: string,
  ) {}

  /** Where snapshots of this cluster may be written: deleted with it. */
  get snapshotDir(): string {
    return this.dir;
  }

  static async start(options: { members?: number } = {}): Promise<EtcdCluster> {
    const count = options.members ?? 1;
    const dir = mkdtempSync(join(tmpdir(), 'ndl-etcd-'));
    const members: EtcdMember[] = [];
    for (let i = 0; i < count; i++) {
      members.push(new EtcdMember(`n${i + 1}`, await freePort(), await freePort(), join(dir, `n${i + 1}`), dir));
    }
    const cluster = new EtcdCluster(members, dir);
    try {
      for (const member of members) member.launch(cluster.initialCluster, 'new');
      await cluster.waitHealthy(30_000);
      for (const member of members) member.quiet();
    } catch (error) {
      await cluster.stop();
      throw error;
    }
    return cluster;
  }

  /** Every member's client URL, as a client is given them. */
  get endpoints(): string[] {
    return this.members.map((member) => member.endpoint);
  }

  private get initialCluster(): string {
    return this.members.map((member) => `${member.name}=${member.peerUrl}`).join(',');
  }

  /** Starts a killed member again with its data, on its ports; resolves once it is healthy. */
  async restart(index: number): Promise<void> {
    const member = this.members[index];
    await member.kill();
    member.launch(this.initialCluster, 'existing');
    await until(() => member.healthy(), 30_000, `etcd ${member.name} to be healthy after its restart`);
    member.quiet();
  }

  /**
   * Saves the keyspace as etcd's backup tool does (`etcdctl snapshot save`, from one member): the
   * file a restore starts from. Needs etcdctl (Debian's etcd-client).
   */
  async saveSnapshot(file: string): Promise<void> {
    const member = this.members.find((m) => m.running);
    if (!member) throw new Error('saveSnapshot(): no member is running');
    await etcdctl(['--endpoints', member.endpoint, 'snapshot', 'save', file]);
  }

  /**
   * Disaster recovery from a snapshot, as etcd's docs describe it: every member is stopped, its data
   * replaced by the snapshot (`etcdctl snapshot restore`, with the same names, peer URLs and token,
   * so the cluster and member ids stay those clients know), and the cluster started again. Every
   * write after the snapshot is gone and the revision goes back to the snapshot's; its leases
   * come back with their whole ttl.
   */
  async restoreSnapshot(file: string): Promise<void> {
    await Promise.all(this.members.map((member) => member.kill()));
    for (const member of this.members) {
      await rm(member.dataDir, { recursive: true, force: true });
      await etcdctl([
        'snapshot',
        'restore',
        file,
        '--name',
        member.name,
        '--data-dir',
        member.dataDir,
        '--initial-cluster',
        this.initialCluster,
        '--initial-cluster-token',
        this.dir,
        '--initial-advertise-peer-urls',
        member.peerUrl,
      ]);
    }
    for (const member of this.members) member.launch(this.initialCluster, 'existing');
    await this.waitHealthy(30_000);
    for (const member of this.members) member.quiet();
  }

  /**
   * Turns etcd's authentication on, as an operator does with etcdctl: a `root` user (password
   * `rootPassword`), then each user with a role of its own that has `permission` on `prefix` (no
   * role when `permission` is absent). After it, every client needs a user, the fixture's admin too.
   */
  async enableAuth(
    rootPassword: string,
    users: { name: string; password: string; prefix?: string; permission?: 'read' | 'write' | 'readwrite' }[],
  ): Promise<void> {
    const at = ['--endpoints', this.endpoints.join(',')];
    await etcdctl([...at, 'user', 'add', `root:${rootPassword}`]);
    await etcdctl([...at, 'user', 'grant-role', 'root', 'root']).catch(() => undefined);
    for (const user of users) {
      await etcdctl([...at, 'user', 'add', `${user.name}:${user.password}`]);
      if (!user.permission) continue;
      await etcdctl([...at, 'role', 'add', `${user.name}-role`]);
      await etcdctl([...at, 'role', 'grant-permission', `${user.name}-role`, user.permission, '--prefix=true', user.prefix ?? '']);
      await etcdctl([...at, 'user', 'grant-role', user.name, `${user.name}-role`]);
    }
    await etcdctl([...at, 'auth', 'enable']);
  }

  /** The index of the member the running members agree is the leader. */
  async leader(timeoutMs = 10_000): Promise<number> {
    let found = -1;
    await until(
      async () => {
        const statuses = await Promise.all(this.members.map((member) => (member.running ? member.status() : undefined)));
        const leaders = new Set(statuses.filter((s) => s && s.leader !== '0').map((s) => s!.leader));
        if (leaders.size !== 1) return false;
        const [leader] = leaders;
        found = statuses.findIndex((s) => s?.memberId === leader);
        return found >= 0;
      },
      timeoutMs,
      'the etcd members to agree on a leader',
    );
    return found;
  }

  /** Resolves once every running member answers a linearizable read. */
  async waitHealthy(timeoutMs = 30_000): Promise<void> {
    await until(
      async () => (await Promise.all(this.members.filter((m) => m.running).map((m) => m.healthy()))).every(Boolean),
      timeoutMs,
      'the etcd cluster to be healthy',
    );
  }

  /** Kills every member and deletes their data. */
  async stop(): Promise<void> {
    await Promise.all(this.members.map((member) => member.kill()));
    await rm(this.dir, { recursive: true, force: true });
  }
}

async function etcdctl(args: string[]): Promise<void> {
  try {
    await promisify(execFile)('etcdctl', args, { env: { ...process.env, ETCDCTL_API: '3' }, timeout: 30_000 });
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    if (code === 'ENOENT') throw new Error('No etcdctl: apt-get install etcd-client (snapshots are saved and restored with it).');
    throw error;
  }
}
