import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { RedisServer } from '../support/redis-server.js';
import { packedTarball, ScratchApp } from './scratch-app.js';

// A Nest 11 app as \`nest new\` sets it up: CommonJS (no "type" in package.json), TypeScript with
// module nodenext, and its Jest suite on jest 30 + ts-jest 29 with Nest's default configuration;
// ioredis 5 and a real Redis.
const controller = `
import { Controller, Get, Param } from '@nestjs/common';
import { LockService, Locked } from 'nest-distributed-lock';

@Controller('orders')
export class OrdersController {
  constructor(private readonly locks: LockService) {}

  @Get(':id')
  @Locked('order:<id>', { wait: 0 })
  async show(@Param('id') id: string) {
    return { id, fencingToken: this.locks.current()?.fencingToken };
  }
}
`;

const appModule = `
import { Module } from '@nestjs/common';
import { DistributedLockModule, RedisLockBackend } from 'nest-distributed-lock';
import { OrdersController } from './orders.controller';

@Module({
  imports: [DistributedLockModule.forRoot({ backend: new RedisLockBackend(process.env.REDIS_URL!) })],
  controllers: [OrdersController],
})
export class AppModule {}
`;

const spec = `
import { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { LockNotAcquiredError, LockService } from 'nest-distributed-lock';
import request from 'supertest';
import { AppModule } from './app.module';

describe('OrdersController', () => {
  let app: INestApplication;

  beforeAll(async () => {
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.init();
  });

  afterAll(async () => {
    await app.close();
  });

  it('loads the CommonJS build of the package, and ioredis 5', () => {
    expect(require.resolve('nest-distributed-lock')).toMatch(/nest-distributed-lock\\/dist\\/cjs\\/index\\.js$/);
    expect(require('ioredis/package.json').version).toMatch(/^5\\./);
  });

  it('runs the handler under the lock', async () => {
    const response = await request(app.getHttpServer()).get('/orders/7').expect(200);
    expect(response.body).toEqual({ id: '7', fencingToken: expect.any(Number) });
  });

  it('answers 409 while another owner holds the lock in Redis', async () => {
    const held = await app.get(LockService).acquire('order:7');
    const redis = new Redis(process.env.REDIS_URL!);
    try {
      expect(await redis.keys('*order:7*')).toContain('lock:order:7');
      await request(app.getHttpServer()).get('/orders/7').expect(409);
    } finally {
      redis.disconnect();
      await held.release();
    }
  });

  it('throws the exported error class', async () => {
    const locks = app.get(LockService);
    const held = await locks.acquire('order:8');
    try {
      await expect(locks.using('order:8', () => 'ran', { wait: 0 })).rejects.toBeInstanceOf(LockNotAcquiredError);
    } finally {
      await held.release();
    }
  });
});
`;

let redis: RedisServer;
let app: ScratchApp;

beforeAll(async () => {
  redis = await RedisServer.start();
  app = new ScratchApp({
    'package.json': {
      name: 'consumer-nest11-cjs',
      private: true,
      dependencies: {
        '@nestjs/common': '^11.0.1',
        '@nestjs/core': '^11.0.1',
        '@nestjs/platform-express': '^11.0.1',
        ioredis: '^5.0.0',
        'nest-distributed-lock': `file:${packedTarball()}`,
        'reflect-metadata': '^0.2.2',
        rxjs: '^7.8.1',
      },
      devDependencies: {
        '@nestjs/testing': '^11.0.1',
        '@types/jest': '^30.0.0',
        '@types/node': '^20.19.0',
        '@types/supertest': '^6.0.2',
        jest: '^30.0.0',
        supertest: '^7.0.0',
        'ts-jest': '^29.2.5',
        typescript: '^5.7.3',
      },
      // Nest 11's generated Jest configuration, unchanged.
      jest: {
        moduleFileExtensions: ['js', 'json', 'ts'],
        rootDir: 'src',
        testRegex: '.*\\.spec\\.ts$',
        transform: { '^.+\\.(t|j)s$': 'ts-jest' },
        collectCoverageFrom: ['**/*.(t|j)s'],
        coverageDirectory: '../coverage',
        testEnvironment: 'node',
      },
    },
    // Nest 11's generated tsconfig.json.
    'tsconfig.json': {
      compilerOptions: {
        module: 'nodenext',
        moduleResolution: 'nodenext',
        resolvePackageJsonExports: true,
        esModuleInterop: true,
        isolatedModules: true,
        declaration: true,
        removeComments: true,
        emitDecoratorMetadata: true,
        experimentalDecorators: true,
        allowSyntheticDefaultImports: true,
        target: 'ES2023',
        sourceMap: true,
        outDir: './dist',
        incremental: true,
        skipLibCheck: true,
        strictNullChecks: true,
        forceConsistentCasingInFileNames: true,
        noImplicitAny: false,
        strictBindCallApply: false,
        noFallthroughCasesInSwitch: false,
      },
    },
    'src/orders.controller.ts': controller,
    'src/app.module.ts': appModule,
    'src/orders.controller.spec.ts': spec,
  });
});

// Deleting the scratch app's node_modules takes long on a busy disk: more than the 30 s default.
afterAll(async () => {
  app?.remove();
  await redis?.stop();
}, 120_000);

describe('a Nest 11 CommonJS app with ioredis 5', () => {
  it('installs the packed package, type-checks, and its own Jest suite passes', async () => {
    await app.install();
    // What `nest build` checks: TS1479 here would mean the package gave CommonJS an ESM-only entry.
    await app.exec(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.json', '--noEmit']);
    const out = await app.exec(process.execPath, ['node_modules/jest/bin/jest.js', '--ci', '--json'], { REDIS_URL: redis.url });
    const report = JSON.parse(out) as { success: boolean; numPassedTests: number; numTotalTests: number };
    expect(report).toMatchObject({ success: true, numPassedTests: 4, numTotalTests: 4 });
  }, 600_000);
});
