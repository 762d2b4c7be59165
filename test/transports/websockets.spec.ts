import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Module, type INestApplication, type LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { IoAdapter } from '@nestjs/platform-socket.io';
import { WsAdapter } from '@nestjs/platform-ws';
import { MessageBody, SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import type { AddressInfo } from 'node:net';
import { io, type Socket } from 'socket.io-client';
import WebSocket from 'ws';
import { DistributedLockModule, LockService, Locked } from '../../lib/index.js';

@WebSocketGateway()
class OrdersGateway {
  @SubscribeMessage('order.pay')
  @Locked('order:<order.id>', { wait: 0 })
  async pay(@MessageBody() order: { id: string }): Promise<{ event: string; data: { paid: string } } | { paid: string }> {
    return { paid: order.id };
  }
}

@Module({ imports: [DistributedLockModule.forRoot({ ttl: 60_000 })], providers: [OrdersGateway] })
class OrdersModule {}

const quiet: LoggerService = { log() {}, warn() {}, error() {} };

const closing: Array<() => unknown> = [];
afterEach(async () => {
  for (const close of closing.splice(0).reverse()) await close();
});

async function start(adapter: 'ws' | 'socket.io'): Promise<{ app: INestApplication; port: number }> {
  const app = await NestFactory.create(OrdersModule, { logger: quiet, abortOnError: false });
  app.useWebSocketAdapter(adapter === 'ws' ? new WsAdapter(app) : new IoAdapter(app));
  closing.push(() => app.close());
  await app.listen(0, '127.0.0.1');
  return { app, port: (app.getHttpServer().address() as AddressInfo).port };
}

/** Runs `fn` while the test holds order 1's lock, as another instance would. */
async function whileHeld<T>(app: INestApplication, fn: () => Promise<T>): Promise<T> {
  const held = await app.get(LockService).acquire('order:1');
  try {
    return await fn();
  } finally {
    await held.release();
  }
}

const conflict = { statusCode: 409, error: 'Conflict', keys: ['lock:order:1'], retryAfterMs: expect.any(Number) };

describe('a busy lock on a gateway, with a real client', () => {
  it('ws: the client gets an exception message with the conflict body', async () => {
    const { app, port } = await start('ws');
    const socket = new WebSocket(`ws://127.0.0.1:${port}`);
    closing.push(() => socket.close());
    await new Promise((resolve, reject) => socket.once('open', resolve).once('error', reject));
    const nextMessage = () =>
      new Promise<{ event: string; data: unknown }>((resolve) => socket.once('message', (raw) => resolve(JSON.parse(String(raw)))));

    const paid = nextMessage();
    socket.send(JSON.stringify({ event: 'order.pay', data: { id: '1' } }));
    expect(await paid).toEqual({ paid: '1' });

    const refused = await whileHeld(app, async () => {
      const message = nextMessage();
      socket.send(JSON.stringify({ event: 'order.pay', data: { id: '1' } }));
      return message;
    });
    expect(refused).toEqual({ event: 'exception', data: expect.objectContaining(conflict) });
  });

  async function socketIoClient(port: number): Promise<Socket> {
    const socket = io(`http://127.0.0.1:${port}`, { transports: ['websocket'], reconnection: false });
    closing.push(() => socket.disconnect());
    await new Promise((resolve, reject) => socket.once('connect', () => resolve(undefined)).once('connect_error', reject));
    return socket;
  }

  it('socket.io: the ack answers with the conflict body, and an exception event carries it too', async () => {
    const { app, port } = await start('socket.io');
    const socket = await socketIoClient(port);
    expect(await socket.timeout(10_000).emitWithAck('order.pay', { id: '1' })).toEqual({ paid: '1' });

    const exception = new Promise((resolve) => socket.once('exception', resolve));
    const ack = await whileHeld(app, () => socket.timeout(10_000).emitWithAck('order.pay', { id: '1' }));
    expect(ack).toMatchObject(conflict);
    expect(await exception).toMatchObject(conflict);
  });

  it('socket.io without an ack: the exception event alone', async () => {
    const { app, port } = await start('socket.io');
    const socket = await socketIoClient(port);
    const exception = await whileHeld(app, async () => {
      const next = new Promise((resolve) => socket.once('exception', resolve));
      socket.emit('order.pay', { id: '1' });
      return next;
    });
    expect(exception).toMatchObject(conflict);
  });

  it('socket.io: a key the request cannot name answers the ack with a 400', async () => {
    const { port } = await start('socket.io');
    const socket = await socketIoClient(port);
    expect(await socket.timeout(10_000).emitWithAck('order.pay', { id: '' })).toMatchObject({ statusCode: 400, error: 'Bad Request' });
  });
});
