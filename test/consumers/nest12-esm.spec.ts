import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { RedisServer } from '../support/redis-server.js';
import { packedTarball, ScratchApp } from './scratch-app.js';

// A Nest 12 app as an ESM TypeScript project, with the newest ioredis, the packed package, and
// a real Redis.
const main = `
import 'reflect-metadata';
import { createRequire } from 'node:module';
import { Controller, Get, Module, Param } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { DistributedLockModule, LockService, Locked, RedisLockBackend } from 'nest-distributed-lock';

@Controller('orders')
class OrdersController {
  constructor(private readonly locks: LockService) {}

  @Get(':id')
  @Locked('order:<id>', { wait: 0 })
  async show(@Param('id') id: string) {
    return { id, fencingToken: this.locks.current()?.fencingToken };
  }
}

@Module({
  imports: [DistributedLockModule.forRoot({ backend: new RedisLockBackend(process.env.REDIS_URL!) })],
  controllers: [OrdersController],
})
class AppModule {}

const app = await NestFactory.create(AppModule, { logger: false });
await app.listen(0, '127.0.0.1');
const url = (await app.getUrl()) + '/orders/7';
const free = await fetch(url);
const held = await app.get(LockService).acquire('order:7');
const redis = new Redis(process.env.REDIS_URL!);
const keysWhileHeld = await redis.keys('*order:7*');
const busy = await fetch(url);
await held.release();
redis.disconnect();
await app.close();
console.log(JSON.stringify({
  free: { status: free.status, body: await free.json() },
  busy: busy.status,
  keysWhileHeld,
  ioredis: (createRequire(import.meta.url)('ioredis/package.json') as { version: string }).version,
  entry: import.meta.resolve('nest-distributed-lock').split('/node_modules/')[1],
}));
`;

let redis: RedisServer;
let app: ScratchApp;

beforeAll(async () => {
  redis = await RedisServer.start();
  app = new ScratchApp({
    'package.json': {
      name: 'consumer-nest12-esm',
      private: true,
      type: 'module',
      dependencies: {
        '@nestjs/common': '^12.0.0',
        '@nestjs/core': '^12.0.0',
        '@nestjs/platform-express': '^12.0.0',
        ioredis: '^6.0.0',
        'nest-distributed-lock': `file:${packedTarball()}`,
        'reflect-metadata': '^0.2.0',
        rxjs: '^7.8.0',
      },
      devDependencies: { '@types/node': '^20.19.0', typescript: '~6.0.0' },
    },
    'tsconfig.json': {
      compilerOptions: {
        target: 'es2022',
        module: 'nodenext',
        strict: true,
        experimentalDecorators: true,
        emitDecoratorMetadata: true,
        skipLibCheck: true,
        types: ['node'],
        rootDir: 'src',
        outDir: 'dist',
      },
      include: ['src'],
    },
    'src/main.ts': main,
  });
});

// Deleting the scratch app's node_modules takes long on a busy disk: more than the 30 s default.
afterAll(async () => {
  app?.remove();
  await redis?.stop();
}, 120_000);

describe('a Nest 12 ESM app with ioredis 6', () => {
  it('installs the packed package, compiles, and serves a @Locked route on Redis', async () => {
    await app.install();
    await app.exec(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.json']);
    const seen = await app.runJson<Record<string, unknown>>('dist/main.js', { REDIS_URL: redis.url });
    expect(seen).toEqual({
      free: { status: 200, body: { id: '7', fencingToken: expect.any(Number) } },
      busy: 409,
      keysWhileHeld: expect.arrayContaining(['lock:order:7']),
      ioredis: expect.stringMatching(/^6\./),
      entry: 'nest-distributed-lock/dist/index.js',
    });
  }, 600_000);
});
