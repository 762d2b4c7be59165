import { createServer, Socket, type Server } from 'node:net';

/** What the proxy does to the traffic it carries. "Up" is client to server, "down" the answers. */
export type ProxyMode =
  | { kind: 'pass' }
  /** Every chunk waits this long, in order: both ways, or only on the way up (`direction: 'up'`). */
  | { kind: 'delay'; ms: number; direction?: 'both' | 'up' }
  /** Open connections are cut and new ones refused: a partition the client notices. */
  | { kind: 'drop' }
  /** Client-to-server bytes vanish, connections stay up: requests are never answered. */
  | { kind: 'blackhole-up' }
  /** Server-to-client bytes vanish: requests are applied but the answers never arrive. */
  | { kind: 'blackhole-down' }
  /**
   * Answers wait `ms` (past the request's deadline when longer than it), and every request chunk
   * is sent a second time `ms` later, on a connection of its own whose answers are dropped: a
   * request applied twice, the copy late (a client resending after a reconnect). Meaningful on
   * a protocol without a handshake (Redis); elsewhere the server refuses the copy.
   */
  | { kind: 'late-replay'; ms: number }
  /**
   * Answers are cut into the protocol's frames (a 4-byte big-endian length, then that many bytes:
   * ZooKeeper's), each written on its own `ms` after the one before: packets the server sent back
   * to back reach the client in reads of their own, in order, as on a slow or lossy link.
   */
  | { kind: 'split-down'; ms: number }
  /**
   * Answers are kept until the client sends more (`requests` more chunks, default 1), then go
   * before it: a server that holds an answer until its next request arrives (ZooKeeper 3.6.0 to
   * 3.8.0 on a missed commit, ZOOKEEPER-4537), or one that misses that request too (2).
   */
  | { kind: 'hold-down-until-up'; requests?: number };

/**
 * A TCP proxy in front of a server on this machine whose behaviour a test, the fault harness or
 * the bench sets: a server far away, a partition, a one-way loss, without root or tc.
 */
export class TcpProxy {
  private readonly sockets = new Set<Socket>();
  /** The answer lanes of open connections, which may hold answers (`hold-down-until-up`). */
  private readonly holding = new Set<Lane>();
  /** The request lanes of open connections, which may delay requests (`delay`). */
  private readonly requests = new Set<Lane>();
  private readonly server: Server;
  mode: ProxyMode;

  private constructor(
    readonly targetPort: number,
    mode: ProxyMode,
  ) {
    this.mode = mode;
    this.server = createServer((client) => this.connect(client));
  }

  static async start(targetPort: number, mode: ProxyMode = { kind: 'pass' }): Promise<TcpProxy> {
    const proxy = new TcpProxy(targetPort, mode);
    await new Promise<void>((resolve) => proxy.server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  /** Answers kept now (`hold-down-until-up`), over every connection. */
  get held(): number {
    let count = 0;
    for (const lane of this.holding) count += lane.holding;
    return count;
  }

  /** Requests kept back now (`delay`), over every connection: one sent is on its way once this counts it. */
  get delayed(): number {
    let count = 0;
    for (const lane of this.requests) count += lane.waiting;
    return count;
  }

  get port(): number {
    return (this.server.address() as { port: number }).port;
  }

  set(mode: ProxyMode): void {
    this.mode = mode;
    if (mode.kind === 'drop') for (const socket of this.sockets) socket.destroy();
    if (mode.kind !== 'hold-down-until-up') for (const lane of this.holding) lane.letGo();
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Sends a copy of a request on a connection of its own; its answers go nowhere. */
  private replay(chunk: Buffer): void {
    const side = new Socket();
    this.sockets.add(side);
    side.on('close', () => this.sockets.delete(side));
    side.on('error', () => side.destroy());
    side.on('data', () => undefined);
    side.connect(this.targetPort, '127.0.0.1', () => side.write(chunk));
    setTimeout(() => side.destroy(), REPLAY_LINGER_MS).unref();
  }

  private connect(client: Socket): void {
    if (this.mode.kind === 'drop') {
      client.destroy();
      return;
    }
    const upstream = new Socket();
    upstream.connect(this.targetPort, '127.0.0.1');
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    const up = new Lane(upstream);
    const down = new Lane(client);
    const frames = new Frames();
    this.holding.add(down);
    this.requests.add(up);
    client.on('close', () => {
      this.holding.delete(down);
      this.requests.delete(up);
    });
    client.on('data', (chunk) => {
      // What the server kept goes out as the client's next bytes reach it.
      if (this.mode.kind === 'hold-down-until-up') down.heard(this.mode.requests ?? 1);
      this.forward(chunk, up, 'up');
    });
    upstream.on('data', (chunk) => this.forward(chunk, down, 'down', frames));
    for (const [from, to] of [
      [client, upstream],
      [upstream, client],
    ]) {
      this.sockets.add(from);
      from.on('close', () => {
        this.sockets.delete(from);
        to.destroy();
      });
      from.on('error', () => to.destroy());
    }
  }

  private forward(chunk: Buffer, lane: Lane, way: 'up' | 'down', frames?: Frames): void {
    const mode = this.mode;
    if (mode.kind === 'drop' || mode.kind === `blackhole-${way}`) return;
    // A frame cut in two goes on whole, after the mode changed too.
    if (frames && (mode.kind === 'split-down' || frames.partial)) {
      for (const frame of frames.cut(chunk)) lane.send(frame, 0, mode.kind === 'split-down' ? mode.ms : 0);
      return;
    }
    if (mode.kind === 'hold-down-until-up' && way === 'down') return void lane.hold(chunk);
    if (mode.kind === 'late-replay') {
      if (way === 'up') setTimeout(() => this.replay(chunk), mode.ms).unref();
      return void lane.send(chunk, way === 'down' ? mode.ms : 0);
    }
    const delayed = mode.kind === 'delay' && (way === 'up' || mode.direction !== 'up');
    lane.send(chunk, delayed ? mode.ms : 0);
  }
}

/** Closes a replay's connection once the server had time to run it. */
const REPLAY_LINGER_MS = 1_000;

/** One direction of a connection: chunks leave in the order they came, each after its delay. */
class Lane {
  private last = 0;
  private pending = 0;
  private tail: Promise<void> = Promise.resolve();

  private held: Buffer[] = [];
  /** Chunks the other way since the first chunk held. */
  private since = 0;

  constructor(private readonly to: Socket) {}

  get holding(): number {
    return this.held.length;
  }

  /** Chunks waiting for their delay to end. */
  get waiting(): number {
    return this.pending;
  }

  /** Kept until letGo(), or until `heard` counts enough chunks the other way. */
  hold(chunk: Buffer): void {
    this.held.push(chunk);
  }

  /** A chunk went the other way: what is held goes once `requests` did. */
  heard(requests: number): void {
    if (this.held.length > 0 && ++this.since >= requests) this.letGo();
  }

  letGo(): void {
    const held = this.held;
    this.held = [];
    this.since = 0;
    for (const chunk of held) this.send(chunk, 0);
  }

  /** `gapMs`: at least this long after the chunk before. */
  send(chunk: Buffer, delayMs: number, gapMs = 0): void {
    // Never before an earlier chunk: a delay that ends must not let new bytes overtake old ones.
    const at = Math.max(Date.now() + delayMs, this.last + gapMs);
    this.last = at;
    if (at <= Date.now() && this.pending === 0) return void this.write(chunk);
    this.pending++;
    this.tail = this.tail.then(async () => {
      const wait = at - Date.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      this.pending--;
      this.write(chunk);
    });
  }

  private write(chunk: Buffer): void {
    if (!this.to.destroyed) this.to.write(chunk);
  }
}

/** Cuts a byte stream into frames of a 4-byte big-endian length and that many bytes. */
class Frames {
  private pending = Buffer.alloc(0);

  get partial(): boolean {
    return this.pending.length > 0;
  }

  cut(chunk: Buffer): Buffer[] {
    this.pending = Buffer.concat([this.pending, chunk]);
    const whole: Buffer[] = [];
    while (this.pending.length >= 4 && this.pending.length >= 4 + this.pending.readInt32BE(0)) {
      const size = 4 + this.pending.readInt32BE(0);
      whole.push(this.pending.subarray(0, size));
      this.pending = this.pending.subarray(size);
    }
    return whole;
  }
}
