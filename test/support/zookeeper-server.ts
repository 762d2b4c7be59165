import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './redis-server.js';

/** Debian's zookeeper package: the server jar and the logging jars it runs with. */
const CLASSPATH = ['/usr/share/java/zookeeper.jar', '/usr/share/java/slf4j-log4j12.jar', '/usr/share/java/log4j-1.2.jar'];

export interface ZooKeeperServerOptions {
  /**
   * The server's tick in ms. Sessions may last from 2 to 20 ticks, so the default 500 lets a test
   * ask for a 1 s session and see a killed client's session expire in about a second.
   */
  tickTime?: number;
}

/** One member of a test's ZooKeeper: its ports, its directory, its JVM. */
class Member {
  child: ChildProcess | undefined;

  constructor(
    readonly id: number,
    readonly clientPort: number,
    readonly dir: string,
    /** ZooKeeperServerMain for a single server, QuorumPeerMain for an ensemble member. */
    private readonly mainClass: string,
  ) {}

  get running(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  launch(): void {
    const log = openSync(join(this.dir, 'server.log'), 'a');
    // The config dir comes first on the classpath: log4j finds its log4j.properties there.
    const args = ['-Xmx256m', '-XX:+UseSerialGC', '-cp', [this.dir, ...CLASSPATH].join(':'), this.mainClass, join(this.dir, 'zoo.cfg')];
    this.child = spawn('java', args, { stdio: ['ignore', log, log] });
    closeSync(log);
  }

  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const child = this.child;
    if (!child || !this.running) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGCONT');
    child.kill(signal);
    await exited;
  }

  /** What `srvr` says: the mode ('standalone', 'leader', 'follower') once it serves, else undefined. */
  async mode(): Promise<string | undefined> {
    const answer = await fourLetterWord(this.clientPort, 'srvr').catch(() => '');
    return /^Mode: (\w+)/m.exec(answer)?.[1];
  }

  log(): string {
    const file = join(this.dir, 'server.log');
    return existsSync(file) ? readFileSync(file, 'utf8').slice(-4_000) : '';
  }
}

/**
 * A ZooKeeper of the test's own: one server, or an ensemble of three, on free ports of 127.0.0.1,
 * data in a temp dir, never the machine's own. Tests may kill, pause and restart its members.
 * Debian's package runs it (`apt-get install zookeeper`, which brings a Java runtime).
 */
export class ZooKeeperServer {
  private constructor(
    private readonly members: Member[],
    private readonly root: string,
  ) {}

  /** A standalone server. */
  static start(options: ZooKeeperServerOptions = {}): Promise<ZooKeeperServer> {
    return ZooKeeperServer.create(1, options);
  }

  /** Three servers that elect a leader; a quorum is two. */
  static startEnsemble(options: ZooKeeperServerOptions = {}): Promise<ZooKeeperServer> {
    return ZooKeeperServer.create(3, options);
  }

  private static async create(size: number, options: ZooKeeperServerOptions): Promise<ZooKeeperServer> {
    if (!existsSync(CLASSPATH[0])) throw new Error(`No ${CLASSPATH[0]}: apt-get install zookeeper (it brings a Java runtime).`);
    const root = mkdtempSync(join(tmpdir(), 'ndl-zookeeper-'));
    const ports: { client: number; peer: number; election: number }[] = [];
    for (let i = 0; i < size; i++) ports.push({ client: await freePort(), peer: await freePort(), election: await freePort() });
    const members = ports.map((port, i) => {
      const dir = join(root, `server${i + 1}`);
      mkdirSync(join(dir, 'data'), { recursive: true });
      const config = [
        `tickTime=${options.tickTime ?? 500}`,
        'initLimit=20',
        'syncLimit=4',
        `dataDir=${join(dir, 'data')}`,
        `clientPort=${port.client}`,
        'clientPortAddress=127.0.0.1',
        'admin.enableServer=false',
        // wchs and wchp: the watches each session left on the server, which tests count.
        '4lw.commands.whitelist=ruok,srvr,wchs,wchp',
        'extendedTypesEnabled=true',
        // Writes are not fsynced: the data is thrown away after the test.
        'forceSync=no',
        'maxClientCnxns=0',
        ...(size > 1 ? ports.map((p, j) => `server.${j + 1}=127.0.0.1:${p.peer}:${p.election}`) : []),
      ];
      writeFileSync(join(dir, 'zoo.cfg'), `${config.join('\n')}\n`);
      writeFileSync(join(dir, 'log4j.properties'), LOG4J);
      if (size > 1) writeFileSync(join(dir, 'data', 'myid'), `${i + 1}\n`);
      const main = size > 1 ? 'org.apache.zookeeper.server.quorum.QuorumPeerMain' : 'org.apache.zookeeper.server.ZooKeeperServerMain';
      return new Member(i + 1, port.client, dir, main);
    });
    const server = new ZooKeeperServer(members, root);
    try {
      for (const member of members) member.launch();
      await server.ready();
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  /** The connection string of every member: `127.0.0.1:p1,127.0.0.1:p2,...`. */
  get connectionString(): string {
    return this.members.map((m) => `127.0.0.1:${m.clientPort}`).join(',');
  }

  get ports(): number[] {
    return this.members.map((m) => m.clientPort);
  }

  /** Resolves once every running member serves (standalone, or leader/follower of a quorum). */
  async ready(timeoutMs = 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (const member of this.members) {
      while (member.running && (await member.mode()) === undefined) {
        if (Date.now() > deadline) throw new Error(`ZooKeeper server ${member.id} did not serve within ${timeoutMs} ms:\n${member.log()}`);
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      if (!member.running && member.child && this.members.length === 1) {
        throw new Error(`ZooKeeper exited before it served:\n${member.log()}`);
      }
    }
  }

  /** The 1-based id of the member that leads now (for an ensemble), or undefined. */
  async leader(): Promise<number | undefined> {
    for (const member of this.members) if (member.running && (await member.mode()) === 'leader') return member.id;
    return undefined;
  }

  /** The member's JVM pid, to pause it with SIGSTOP. */
  pid(id: number): number | undefined {
    return this.member(id).child?.pid;
  }

  /** Kills one member at once (SIGKILL), as a crash would; its data stays for `restart(id)`. */
  kill(id: number): Promise<void> {
    return this.member(id).kill();
  }

  /** Starts a killed member again, on the same ports with the same data. */
  async restart(id: number): Promise<void> {
    const member = this.member(id);
    await member.kill();
    member.launch();
    const deadline = Date.now() + 60_000;
    while ((await member.mode()) === undefined) {
      if (Date.now() > deadline) throw new Error(`ZooKeeper server ${id} did not serve again within 60 s:\n${member.log()}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Starts a member again if it is not running (after `kill(id)`); else does nothing. */
  async revive(id: number): Promise<void> {
    if (!this.member(id).running) await this.restart(id);
  }

  async stop(): Promise<void> {
    await Promise.all(this.members.map((m) => m.kill()));
    await rm(this.root, { recursive: true, force: true });
  }

  private member(id: number): Member {
    const member = this.members[id - 1];
    if (!member) throw new Error(`no ZooKeeper server ${id}: this one has ${this.members.length}`);
    return member;
  }
}

const LOG4J = `log4j.rootLogger=WARN, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1}: %m%n
`;

/** Sends a four-letter word (`ruok`, `srvr`) and returns the whole answer. */
export function fourLetterWord(port: number, word: string, timeoutMs = 2_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let answer = '';
    socket.setTimeout(timeoutMs, () => socket.destroy(new Error(`no answer to ${word} within ${timeoutMs} ms`)));
    socket.on('connect', () => socket.write(word));
    socket.on('data', (chunk) => (answer += chunk.toString()));
    socket.on('end', () => resolve(answer));
    socket.on('error', reject);
  });
}
