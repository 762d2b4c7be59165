import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { packedTarball, ScratchApp } from './scratch-app.js';

// One small CommonJS Nest 11 app, compiled by TypeScript with each `module` setting a CommonJS
// project uses, then run: it serves a @Locked route on the in-memory backend.
const main = `
import 'reflect-metadata';
import { Controller, Get, Module, Param } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DistributedLockModule, LockService, Locked, LockNotAcquiredError } from 'nest-distributed-lock';

@Controller('orders')
class OrdersController {
  constructor(private readonly locks: LockService) {}

  @Get(':id')
  @Locked('order:<id>', { wait: 0 })
  async show(@Param('id') id: string) {
    return { id, held: this.locks.current() !== undefined };
  }
}

@Module({ imports: [DistributedLockModule.forRoot()], controllers: [OrdersController] })
class AppModule {}

async function main(): Promise<void> {
  const app = await NestFactory.create(AppModule, { logger: false });
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()) + '/orders/7';
  const free = await fetch(url);
  const locks = app.get(LockService);
  const held = await locks.acquire('order:7');
  const busy = await fetch(url);
  const error = await locks.using('order:7', () => 'ran', { wait: 0 }).catch((e: unknown) => e);
  await held.release();
  await app.close();
  console.log(JSON.stringify({
    free: { status: free.status, body: await free.json() },
    busy: busy.status,
    typedError: error instanceof LockNotAcquiredError,
    entry: require.resolve('nest-distributed-lock').split('/node_modules/')[1],
  }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
`;

const settings = ['node16', 'nodenext', 'commonjs'] as const;

let app: ScratchApp;

beforeAll(() => {
  const tsconfig = (module: string) => ({
    compilerOptions: {
      target: 'es2022',
      module,
      strict: true,
      esModuleInterop: true,
      experimentalDecorators: true,
      emitDecoratorMetadata: true,
      skipLibCheck: true,
      types: ['node'],
      rootDir: 'src',
      outDir: `out-${module}`,
    },
    include: ['src'],
  });
  app = new ScratchApp({
    'package.json': {
      name: 'consumer-typescript-modules',
      private: true,
      dependencies: {
        '@nestjs/common': '^11.0.1',
        '@nestjs/core': '^11.0.1',
        '@nestjs/platform-express': '^11.0.1',
        'nest-distributed-lock': `file:${packedTarball()}`,
        'reflect-metadata': '^0.2.2',
        rxjs: '^7.8.1',
      },
      devDependencies: { '@types/node': '^20.19.0', typescript: '^5.7.3' },
    },
    ...Object.fromEntries(settings.map((module) => [`tsconfig.${module}.json`, tsconfig(module)])),
    'src/main.ts': main,
  });
});

// Deleting the scratch app's node_modules takes long on a busy disk: more than the 30 s default.
afterAll(() => app?.remove(), 120_000);

describe('a CommonJS app compiled with each TypeScript module setting', () => {
  beforeAll(() => app.install(), 600_000);

  it.each(settings)(
    'module %s: compiles against the package types and serves a @Locked route',
    async (module) => {
      await app.exec(process.execPath, ['node_modules/typescript/bin/tsc', '-p', `tsconfig.${module}.json`]);
      expect(await app.runJson(`out-${module}/main.js`)).toEqual({
        free: { status: 200, body: { id: '7', held: true } },
        busy: 409,
        typedError: true,
        entry: 'nest-distributed-lock/dist/cjs/index.js',
      });
    },
    120_000,
  );
});
