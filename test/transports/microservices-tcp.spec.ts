import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Controller, Module, UseInterceptors, type INestApplication, type INestMicroservice, type LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ClientProxyFactory, MessagePattern, Payload, Transport, type ClientProxy, type MicroserviceOptions } from '@nestjs/microservices';
import { firstValueFrom } from 'rxjs';
import { DistributedLockModule, LockInterceptor, LockService, Locked } from '../../lib/index.js';
import { freePort } from '../support/redis-server.js';

@Controller()
class PaymentsController {
  @MessagePattern('order.pay')
  @Locked('order:<order.id>', { wait: 0 })
  async pay(@Payload() order: { id: string }): Promise<{ paid: string }> {
    return { paid: order.id };
  }

  /** A key a request cannot name: the client's mistake, not a server error. */
  @MessagePattern('order.refund')
  @Locked('order:<order.id>', { wait: 0 })
  async refund(@Payload() order: { id: string }): Promise<{ refunded: string }> {
    return { refunded: order.id };
  }
}

@Module({ imports: [DistributedLockModule.forRoot({ ttl: 60_000 })], controllers: [PaymentsController] })
class PaymentsModule {}

/**
 * What a hybrid app that does not inherit the app's config writes: the microservice gets none of
 * the app's global interceptors (not even those added to it later: its handlers are bound when it
 * is connected), so the controller binds LockInterceptor itself.
 */
@Controller()
@UseInterceptors(LockInterceptor)
class BoundPaymentsController extends PaymentsController {}

@Module({ imports: [DistributedLockModule.forRoot({ ttl: 60_000 })], controllers: [BoundPaymentsController] })
class BoundPaymentsModule {}

/** Nest's own log, muted: what matters is what the client gets. */
const quiet: LoggerService = { log() {}, warn() {}, error() {} };

const closing: Array<{ close(): Promise<unknown> | unknown }> = [];
afterEach(async () => {
  for (const item of closing.splice(0).reverse()) await item.close();
});

async function clientOf(port: number): Promise<ClientProxy> {
  const client = ClientProxyFactory.create({ transport: Transport.TCP, options: { host: '127.0.0.1', port } });
  closing.push(client);
  await client.connect();
  return client;
}

/** What the client gets for `pattern` while the test holds order 1's lock elsewhere. */
async function replyWhileHeld(locks: LockService, client: ClientProxy, pattern: string, order: unknown): Promise<unknown> {
  const held = await locks.acquire('order:1');
  try {
    return await firstValueFrom(client.send(pattern, order)).catch((error: unknown) => ({ rejected: error }));
  } finally {
    await held.release();
  }
}

const conflict = { rejected: { statusCode: 409, error: 'Conflict', keys: ['lock:order:1'], retryAfterMs: expect.any(Number) } };

describe('a busy lock over TCP microservices, with a real ClientProxy', () => {
  it('reaches the client of a standalone microservice as the conflict body', async () => {
    const port = await freePort();
    const service = await NestFactory.createMicroservice<MicroserviceOptions>(PaymentsModule, {
      transport: Transport.TCP,
      options: { host: '127.0.0.1', port },
      logger: quiet,
      abortOnError: false,
    });
    closing.push(service);
    await service.listen();
    const client = await clientOf(port);

    expect(await firstValueFrom(client.send('order.pay', { id: '1' }))).toEqual({ paid: '1' });
    expect(await replyWhileHeld(service.get(LockService), client, 'order.pay', { id: '1' })).toMatchObject(conflict);
    expect(await replyWhileHeld(service.get(LockService), client, 'order.refund', { id: '' })).toMatchObject({
      rejected: { statusCode: 400, error: 'Bad Request' },
    });
  });

  async function hybrid(
    connect: (app: INestApplication, port: number) => INestMicroservice,
    module: object = PaymentsModule,
  ): Promise<{ app: INestApplication; client: ClientProxy }> {
    const port = await freePort();
    const app = await NestFactory.create(module, { logger: quiet, abortOnError: false });
    closing.push(app);
    connect(app, port);
    await app.startAllMicroservices();
    await app.listen(0, '127.0.0.1');
    return { app, client: await clientOf(port) };
  }

  it('reaches the client of a hybrid app that inherits the app config', async () => {
    const { app, client } = await hybrid((app, port) =>
      app.connectMicroservice<MicroserviceOptions>(
        { transport: Transport.TCP, options: { host: '127.0.0.1', port } },
        { inheritAppConfig: true },
      ),
    );
    expect(await replyWhileHeld(app.get(LockService), client, 'order.pay', { id: '1' })).toMatchObject(conflict);
  });

  it('reaches the client of a hybrid app that does not inherit it, from a controller that binds LockInterceptor', async () => {
    const { app, client } = await hybrid(
      (app, port) => app.connectMicroservice<MicroserviceOptions>({ transport: Transport.TCP, options: { host: '127.0.0.1', port } }),
      BoundPaymentsModule,
    );
    expect(await replyWhileHeld(app.get(LockService), client, 'order.pay', { id: '1' })).toMatchObject(conflict);
  });

  it('is an unknown error to the client of a hybrid app that neither inherits the config nor uses the interceptor (why the docs say to)', async () => {
    const { app, client } = await hybrid((app, port) =>
      app.connectMicroservice<MicroserviceOptions>({ transport: Transport.TCP, options: { host: '127.0.0.1', port } }),
    );
    expect(await replyWhileHeld(app.get(LockService), client, 'order.pay', { id: '1' })).toEqual({
      rejected: { status: 'error', message: 'Internal server error' },
    });
  });
});
