import { createServer, Socket, type Server } from 'node:net';

/** What the proxy does to traffic between one worker and its lock store. */
export type ProxyMode =
  | { kind: 'pass' }
  /** Every chunk, both ways, waits this long (in order). */
  | { kind: 'delay'; ms: number }
  /** Open connections are cut and new ones refused: a partition the client notices. */
  | { kind: 'drop' }
  /** Worker-to-store bytes vanish, connections stay up: requests are never answered. */
  | { kind: 'blackhole-up' }
  /** Store-to-worker bytes vanish: requests are applied but the answers never arrive. */
  | { kind: 'blackhole-down' };

/** A TCP proxy between one worker and a server on this machine, whose behaviour the harness sets. */
export class ChaosProxy {
  private readonly sockets = new Set<Socket>();
  private readonly server: Server;
  mode: ProxyMode = { kind: 'pass' };

  private constructor(private readonly targetPort: number) {
    this.server = createServer((client) => this.connect(client));
  }

  static async start(targetPort: number): Promise<ChaosProxy> {
    const proxy = new ChaosProxy(targetPort);
    await new Promise<void>((resolve) => proxy.server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  get port(): number {
    return (this.server.address() as { port: number }).port;
  }

  set(mode: ProxyMode): void {
    this.mode = mode;
    if (mode.kind === 'drop') for (const socket of this.sockets) socket.destroy();
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
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
    client.on('data', (chunk) => this.forward(chunk, up, 'blackhole-up'));
    upstream.on('data', (chunk) => this.forward(chunk, down, 'blackhole-down'));
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

  private forward(chunk: Buffer, lane: Lane, blackhole: ProxyMode['kind']): void {
    const mode = this.mode;
    if (mode.kind === blackhole || mode.kind === 'drop') return;
    lane.send(chunk, mode.kind === 'delay' ? mode.ms : 0);
  }
}

/** One direction of a connection: chunks leave in the order they came, each after its delay. */
class Lane {
  private last = 0;
  private tail: Promise<void> = Promise.resolve();

  constructor(private readonly to: Socket) {}

  send(chunk: Buffer, delayMs: number): void {
    // Never before an earlier chunk: a delay that ends must not let new bytes overtake old ones.
    const at = Math.max(Date.now() + delayMs, this.last);
    this.last = at;
    if (at <= Date.now() && this.idle) return void this.write(chunk);
    this.pending++;
    this.tail = this.tail.then(async () => {
      const wait = at - Date.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      this.pending--;
      this.write(chunk);
    });
  }

  private pending = 0;

  private get idle(): boolean {
    return this.pending === 0;
  }

  private write(chunk: Buffer): void {
    if (!this.to.destroyed) this.to.write(chunk);
  }
}
