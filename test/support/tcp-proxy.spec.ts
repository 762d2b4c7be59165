import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { TcpProxy } from './tcp-proxy.js';
import { until } from './wait.js';

/** An echo server that also counts the bytes it received. */
function echoServer(): { server: Server; received: () => number } {
  let received = 0;
  const server = createServer((socket) =>
    socket.on('data', (chunk) => {
      received += chunk.length;
      socket.write(chunk);
    }),
  );
  return { server, received: () => received };
}

describe('the test harness TCP proxy', () => {
  const echo = echoServer();
  let proxy: TcpProxy;
  const clients: Socket[] = [];
  beforeAll(async () => {
    await new Promise<void>((resolve) => echo.server.listen(0, '127.0.0.1', resolve));
    proxy = await TcpProxy.start((echo.server.address() as { port: number }).port);
  });
  afterEach(() => {
    proxy.set({ kind: 'pass' });
    for (const client of clients.splice(0)) client.destroy();
  });
  afterAll(async () => {
    await proxy.close();
    await new Promise((resolve) => echo.server.close(resolve));
  });

  async function connect(): Promise<{ socket: Socket; answers: () => string; closed: () => boolean }> {
    let answers = '';
    let closed = false;
    const socket = createConnection(proxy.port, '127.0.0.1');
    clients.push(socket);
    socket.on('data', (chunk) => (answers += chunk.toString())).on('close', () => (closed = true));
    socket.on('error', () => undefined);
    await new Promise((resolve) => socket.once('connect', resolve));
    return { socket, answers: () => answers, closed: () => closed };
  }

  it('passes bytes both ways, in order, and delays them on the way up only when asked', async () => {
    const client = await connect();
    client.socket.write('ab');
    await until(() => client.answers() === 'ab', 2_000, 'the echo');
    proxy.set({ kind: 'delay', ms: 150, direction: 'up' });
    const sent = performance.now();
    client.socket.write('c');
    await until(() => client.answers() === 'abc', 2_000, 'the delayed echo');
    expect(performance.now() - sent).toBeGreaterThanOrEqual(140);
  });

  it('loses one direction in a blackhole, and cuts and refuses connections on drop', async () => {
    // What must not happen is watched for a fixed while: there is no event for bytes that vanish.
    const quiet = () => new Promise((resolve) => setTimeout(resolve, 300));
    const client = await connect();
    let before = echo.received();
    proxy.set({ kind: 'blackhole-down' });
    client.socket.write('x');
    await until(() => echo.received() === before + 1, 2_000, 'the server to receive');
    await quiet();
    expect(client.answers()).toBe('');
    before = echo.received();
    proxy.set({ kind: 'blackhole-up' });
    client.socket.write('y');
    await quiet();
    expect(echo.received()).toBe(before);
    expect(client.answers()).toBe('');
    proxy.set({ kind: 'drop' });
    await until(client.closed, 2_000, 'the connection to be cut');
    const refused = createConnection(proxy.port, '127.0.0.1').on('error', () => undefined);
    clients.push(refused);
    await new Promise((resolve) => refused.once('close', resolve));
  });

  it('keeps answers until the client sends as many more chunks as asked, then lets them go first', async () => {
    const client = await connect();
    proxy.set({ kind: 'hold-down-until-up', requests: 2 });
    client.socket.write('a');
    await until(() => proxy.held === 1, 2_000, 'the answer to a to be kept');
    client.socket.write('b');
    await until(() => proxy.held === 2, 2_000, 'the answer to b to be kept too');
    expect(client.answers()).toBe('');
    client.socket.write('c');
    await until(() => client.answers() === 'ab', 2_000, 'the kept answers');
    proxy.set({ kind: 'pass' });
    await until(() => client.answers() === 'abc', 2_000, 'the answer kept when the mode changed');
  });
});
