import { createServer, Socket, type Server } from 'node:net';

/**
 * A TCP proxy that holds every client-to-server chunk for `delayMs` before passing it on: a
 * master that far away on the network, without root or tc. Timers of one duration fire in
 * order, so the byte stream stays in order.
 */
export class DelayProxy {
  private readonly sockets = new Set<Socket>();
  private readonly server: Server;

  private constructor(targetPort: number, delayMs: number) {
    this.server = createServer((client) => {
      const upstream = new Socket();
      upstream.connect(targetPort, '127.0.0.1');
      client.setNoDelay(true);
      upstream.setNoDelay(true);
      client.on('data', (chunk) => setTimeout(() => upstream.write(chunk), delayMs));
      upstream.on('data', (chunk) => client.write(chunk));
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
    });
  }

  static async start(targetPort: number, delayMs: number): Promise<DelayProxy> {
    const proxy = new DelayProxy(targetPort, delayMs);
    await new Promise<void>((resolve) => proxy.server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  get port(): number {
    return (this.server.address() as { port: number }).port;
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
