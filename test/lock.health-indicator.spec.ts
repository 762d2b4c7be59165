import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Controller, Get, Module, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { HealthCheck, HealthCheckService, TerminusModule } from '@nestjs/terminus';
import type { AddressInfo } from 'node:net';
import {
  DistributedLockModule,
  InvalidLockOptionsError,
  LockBackendError,
  LockHealthIndicator,
  LockService,
  MemoryLockBackend,
  type LockBackend,
} from '../lib/index.js';

@Controller('health')
class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly locks: LockHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check() {
    return this.health.check([() => this.locks.isHealthy('locks', { timeout: 200 })]);
  }
}

/** A backend whose server stopped answering: every call hangs. */
class HangingBackend extends MemoryLockBackend {
  override inspect(): Promise<never> {
    return new Promise(() => {});
  }
  override tryAcquire(): Promise<never> {
    return new Promise(() => {});
  }
}

/** A store that answers reads and refuses every write, as a read-only role or server does. */
class ReadOnlyBackend extends MemoryLockBackend {
  override async tryAcquire(): Promise<never> {
    throw new LockBackendError('memory', 'cannot execute a write in a read-only transaction', undefined, { permanent: true });
  }
}

function appModule(backend: LockBackend) {
  @Module({ imports: [TerminusModule, DistributedLockModule.forRoot({ backend })], controllers: [HealthController] })
  class AppModule {}
  return AppModule;
}

const apps: INestApplication[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((app) => app.close()));
});

async function health(backend: LockBackend): Promise<{ status: number; body: Record<string, unknown> }> {
  const app = await NestFactory.create(appModule(backend), { logger: false, abortOnError: false });
  apps.push(app);
  await app.listen(0, '127.0.0.1');
  const { port } = app.getHttpServer().address() as AddressInfo;
  const response = await fetch(`http://127.0.0.1:${port}/health`);
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

describe('LockHealthIndicator with @nestjs/terminus', () => {
  it('is up with the backend and its latency when the backend answers', async () => {
    const { status, body } = await health(new MemoryLockBackend());
    expect(status).toBe(200);
    expect(body).toMatchObject({ status: 'ok', info: { locks: { status: 'up', backend: 'memory', latencyMs: expect.any(Number) } } });
  });

  it('is down (503) with the reason when the backend does not answer within the timeout', async () => {
    const { status, body } = await health(new HangingBackend());
    expect(status).toBe(503);
    expect(body).toMatchObject({
      status: 'error',
      error: { locks: { status: 'down', backend: 'memory', message: 'the memory backend did not answer within 200 ms' } },
    });
  });

  it('is down with what the backend says of its servers when they answer but cannot serve locks', async () => {
    const backend = new MemoryLockBackend();
    Object.assign(backend, { health: async () => ({ up: false, details: { role: 'slave' }, message: 'Redis is a slave.' }) });
    const result = await new LockHealthIndicator(new LockService(backend)).isHealthy();
    expect(result).toEqual({
      locks: { status: 'down', backend: 'memory', latencyMs: expect.any(Number), role: 'slave', message: 'Redis is a slave.' },
    });
  });

  it('is down when the store answers reads but refuses to take a lock (a read-only role or server)', async () => {
    const result = await new LockHealthIndicator(new LockService(new ReadOnlyBackend())).isHealthy();
    expect(result).toEqual({
      locks: {
        status: 'down',
        backend: 'memory',
        latencyMs: expect.any(Number),
        message: expect.stringContaining('read-only transaction'),
      },
    });
  });

  it('takes and releases its probe key, and is up when another instance holds the probe at that moment', async () => {
    const backend = new MemoryLockBackend();
    const locks = new LockService(backend);
    const indicator = new LockHealthIndicator(locks);
    expect(await indicator.isHealthy()).toMatchObject({ locks: { status: 'up' } });
    expect(await backend.inspect('lock:health:probe')).toBeUndefined();
    const probing = await new LockService(backend).acquire('health:probe');
    expect(await indicator.isHealthy()).toMatchObject({ locks: { status: 'up' } });
    await probing.release();
  });

  it('refuses a timeout that is not a positive number, naming it', async () => {
    const indicator = new LockHealthIndicator(new LockService(new MemoryLockBackend()));
    await expect(indicator.isHealthy('locks', { timeout: 0 })).rejects.toThrow(InvalidLockOptionsError);
    await expect(indicator.isHealthy('locks', { timeout: Number.NaN })).rejects.toThrow(
      /timeout must be a positive number of milliseconds, got NaN/,
    );
  });
});
