import { describe, expect, it, beforeAll, afterAll } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '..');

/** The package built once, as `npm run build` builds it, for the apps below to install. */
let built: string | undefined;
function builtDist(): string {
  if (built === undefined) {
    built = mkdtempSync(join(tmpdir(), 'ndl-built-'));
    execFileSync(process.execPath, [join(root, 'scripts/build.mjs'), join(built, 'dist')], { stdio: 'pipe' });
  }
  return join(built, 'dist');
}
afterAll(() => {
  if (built !== undefined) rmSync(built, { recursive: true, force: true });
});

/**
 * Builds the package as `npm run build` does, installs it into a scratch app's node_modules the
 * way npm would (package.json + the `files` it ships), and loads it from ESM and from CommonJS.
 */
describe('the published package', () => {
  let app: string;

  beforeAll(() => {
    app = mkdtempSync(join(tmpdir(), 'ndl-package-'));
    const installed = join(app, 'node_modules', 'nest-distributed-lock');
    mkdirSync(installed, { recursive: true });
    cpSync(builtDist(), join(installed, 'dist'), { recursive: true });
    const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
      files: string[];
      dependencies: Record<string, string>;
    };
    writeFileSync(join(installed, 'package.json'), JSON.stringify(manifest));
    // The app's required peers and the package's own dependencies, from this repo's node_modules;
    // not the optional peers (ioredis, redlock, pg, etcd3, @opentelemetry/api): the package must load without them.
    // (Node resolves a symlinked package's own dependencies from its real path.)
    for (const dep of ['@nestjs', 'reflect-metadata', 'rxjs', ...Object.keys(manifest.dependencies)]) {
      symlinkSync(join(root, 'node_modules', dep), join(app, 'node_modules', dep));
    }
    expect(manifest.files).toEqual(['dist']);
  }, 60_000);

  afterAll(() => rmSync(app, { recursive: true, force: true }));

  it('ships type declarations next to the entry named in the exports map', () => {
    const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
      exports: Record<string, Record<string, Record<string, string>>>;
    };
    const entry = manifest.exports['.'];
    const files = Object.values(entry).flatMap((condition) => Object.values(condition));
    expect(files).toEqual(expect.arrayContaining(['./dist/index.js', './dist/index.d.ts', './dist/cjs/index.js', './dist/cjs/index.d.ts']));
    for (const file of files) expect(existsSync(join(app, 'node_modules/nest-distributed-lock', file))).toBe(true);
  });

  it('ships types without internal members, and every declaration file compiles on its own', () => {
    const dist = join(app, 'node_modules/nest-distributed-lock/dist');
    for (const dir of [dist, join(dist, 'cjs')]) {
      const service = readFileSync(join(dir, 'lock.service.d.ts'), 'utf8');
      for (const member of ['run<', 'fullKeys(', 'leaseEnded(', 'leaseFreed(', 'leaseStarted(', 'track('])
        expect(service).not.toContain(member);
      expect(readFileSync(join(dir, 'lock.handle.d.ts'), 'utf8')).not.toContain('releaseQuietly');
    }
    // All of them, not only those the entry reaches, without skipLibCheck; the optional peers' types
    // come from this repo (the scratch app does not install them).
    const peer = (name: string) => {
      const dir = join(root, 'node_modules', name);
      const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { types?: string; typings?: string };
      return [join(dir, (manifest.types ?? manifest.typings)!)];
    };
    // pg ships no types of its own: they are @types/pg, which the app installs with it.
    const pgTypes = join(root, 'node_modules/@types/pg/index.d.ts');
    const compilerOptions = {
      strict: true,
      noEmit: true,
      module: 'nodenext',
      types: ['node'],
      typeRoots: [join(root, 'node_modules/@types')],
      paths: {
        ioredis: peer('ioredis'),
        redlock: peer('redlock'),
        '@opentelemetry/api': peer('@opentelemetry/api'),
        pg: [pgTypes],
        etcd3: peer('etcd3'),
        // mysql2 names its types without an extension, which ESM resolution does not complete.
        mysql2: [join(root, 'node_modules/mysql2/index.d.ts')],
      },
    };
    writeFileSync(
      join(app, 'tsconfig.types.json'),
      JSON.stringify({ compilerOptions, include: ['node_modules/nest-distributed-lock/dist/**/*.d.ts'] }),
    );
    const tsc = join(root, 'node_modules/typescript/bin/tsc');
    const errors = (() => {
      try {
        return execFileSync(process.execPath, [tsc, '-p', 'tsconfig.types.json'], { cwd: app, encoding: 'utf8' });
      } catch (error) {
        return (error as { stdout: string }).stdout;
      }
    })();
    expect(errors).toBe('');
  }, 60_000);

  const script = (load: string) => `
    ${load}
    const { Injectable, Module } = common;
    const { NestFactory } = core;
    class Jobs { async nightly(day) { return lib.LockService && day; } }
    const descriptor = Object.getOwnPropertyDescriptor(Jobs.prototype, 'nightly');
    lib.Locked('job:<day>', { wait: 0 })(Jobs.prototype, 'nightly', descriptor);
    Object.defineProperty(Jobs.prototype, 'nightly', descriptor);
    Injectable()(Jobs);
    class AppModule {}
    Module({ imports: [lib.DistributedLockModule.forRoot()], providers: [Jobs] })(AppModule);
    const app = await NestFactory.createApplicationContext(AppModule, { logger: false });
    const locks = app.get(lib.LockService);
    const held = await locks.acquire('job:mon');
    const skipped = await app.get(Jobs).nightly('mon').catch((e) => e.name);
    await held.release();
    const ran = await app.get(Jobs).nightly('mon');
    await app.close();
    console.log(JSON.stringify({ skipped, ran }));
  `;

  it('works from an ESM app by its package name', () => {
    writeFileSync(
      join(app, 'esm.mjs'),
      script(
        `import 'reflect-metadata'; import * as lib from 'nest-distributed-lock'; import * as common from '@nestjs/common'; import * as core from '@nestjs/core';`,
      ),
    );
    const out = execFileSync(process.execPath, ['esm.mjs'], { cwd: app, encoding: 'utf8' });
    expect(JSON.parse(out.trim().split('\n').pop()!)).toEqual({ skipped: 'LockNotAcquiredError', ran: 'mon' });
  }, 30_000);

  it('says which package to install, at construction, when a backend needs an optional peer the app lacks (ESM and CommonJS)', () => {
    const body = `
      const backends = {
        redis: () => new lib.RedisLockBackend('redis://127.0.0.1:6379'),
        redlock: () => new lib.RedlockLockBackend(['redis://127.0.0.1:6379']),
        postgres: () => new lib.PostgresLockBackend('postgres://127.0.0.1:5432/app'),
        mysql: () => new lib.MysqlLockBackend('mysql://127.0.0.1:3306/app'),
        etcd: () => new lib.EtcdLockBackend('http://127.0.0.1:2379'),
        zookeeper: () => new lib.ZooKeeperLockBackend('127.0.0.1:2181'),
        telemetry: () => new lib.LockService(undefined, { telemetry: true }),
      };
      const seen = {};
      for (const [name, create] of Object.entries(backends)) {
        try { create(); seen[name] = 'created'; }
        catch (error) { seen[name] = { type: error.constructor.name, ours: error instanceof lib.DistributedLockError, message: error.message }; }
      }
      console.log(JSON.stringify(seen));`;
    writeFileSync(join(app, 'peers.mjs'), `import * as lib from 'nest-distributed-lock';${body}`);
    writeFileSync(join(app, 'peers.cjs'), `const lib = require('nest-distributed-lock');${body}`);
    for (const file of ['peers.mjs', 'peers.cjs']) {
      const seen = JSON.parse(execFileSync(process.execPath, [file], { cwd: app, encoding: 'utf8' }).trim()) as Record<string, unknown>;
      expect(seen.redis).toEqual({ type: 'InvalidLockOptionsError', ours: true, message: expect.stringContaining('npm install ioredis') });
      expect(seen.redlock).toEqual({
        type: 'InvalidLockOptionsError',
        ours: true,
        message: expect.stringContaining('npm install redlock@5.0.0-beta.2 ioredis'),
      });
      expect(seen.postgres).toEqual({ type: 'InvalidLockOptionsError', ours: true, message: expect.stringContaining('npm install pg') });
      expect(seen.mysql).toEqual({ type: 'InvalidLockOptionsError', ours: true, message: expect.stringContaining('npm install mysql2') });
      expect(seen.etcd).toEqual({ type: 'InvalidLockOptionsError', ours: true, message: expect.stringContaining('npm install etcd3') });
      expect(seen.zookeeper).toEqual({
        type: 'InvalidLockOptionsError',
        ours: true,
        message: expect.stringContaining('npm install node-zookeeper-client@1.1.3'),
      });
      expect(seen.telemetry).toEqual({
        type: 'InvalidLockOptionsError',
        ours: true,
        message: expect.stringContaining("option 'telemetry' needs the '@opentelemetry/api' package: npm install @opentelemetry/api"),
      });
    }
  }, 30_000);

  it('works from a CommonJS app through require()', () => {
    writeFileSync(
      join(app, 'cjs.cjs'),
      `(async () => { require('reflect-metadata'); const lib = require('nest-distributed-lock'); const common = require('@nestjs/common'); const core = require('@nestjs/core');
      ${script('')} })().catch((e) => { console.error(e); process.exit(1); });`,
    );
    const out = execFileSync(process.execPath, ['cjs.cjs'], { cwd: app, encoding: 'utf8' });
    expect(JSON.parse(out.trim().split('\n').pop()!)).toEqual({ skipped: 'LockNotAcquiredError', ran: 'mon' });
  }, 30_000);
});

/**
 * An ESM app whose CommonJS dependency requires the package loads both builds in one process.
 * Their state must not split: a lock held through one build is held for the other.
 */
describe('the ESM and CommonJS builds loaded in one process', () => {
  let app: string;

  beforeAll(() => {
    app = mkdtempSync(join(tmpdir(), 'ndl-dual-'));
    const installed = join(app, 'node_modules', 'nest-distributed-lock');
    mkdirSync(installed, { recursive: true });
    cpSync(builtDist(), join(installed, 'dist'), { recursive: true });
    writeFileSync(join(installed, 'package.json'), readFileSync(join(root, 'package.json')));
    for (const dep of ['@nestjs', 'reflect-metadata', 'rxjs', 'acorn'])
      symlinkSync(join(root, 'node_modules', dep), join(app, 'node_modules', dep));
  }, 60_000);

  afterAll(() => rmSync(app, { recursive: true, force: true }));

  it('share held locks, the lease scheduler, the module binding of @Locked, and instanceof on errors', () => {
    writeFileSync(
      join(app, 'dual.mjs'),
      `import 'reflect-metadata';
      import { createRequire } from 'node:module';
      import * as esm from 'nest-distributed-lock';
      import { Injectable, Module } from '@nestjs/common';
      import { NestFactory } from '@nestjs/core';
      const require = createRequire(import.meta.url);
      const cjs = require('nest-distributed-lock');
      const seen = { files: [import.meta.resolve('nest-distributed-lock').split('/node_modules/')[1], require.resolve('nest-distributed-lock').split('/node_modules/')[1]] };
      seen.twoCopies = esm.LockService !== cjs.LockService;

      const backend = new esm.MemoryLockBackend();
      const viaEsm = new esm.LockService(backend);
      const viaCjs = new cjs.LockService(backend);
      seen.reentered = await viaEsm.using('k', () => viaCjs.using('k', () => 'reentered', { wait: 0 })).catch((e) => e.name);

      const held = await viaEsm.acquire('busy');
      const error = await viaCjs.using('busy', () => 'ran', { wait: 0 }).catch((e) => e);
      await held.release();
      seen.instanceOf = {
        sameClassOtherBuild: error instanceof esm.LockNotAcquiredError,
        baseClassOtherBuild: error instanceof esm.DistributedLockError,
        sameBuild: error instanceof cjs.LockNotAcquiredError,
        unrelatedClass: error instanceof esm.LockLostError,
        plainError: new Error('x') instanceof esm.DistributedLockError,
      };

      const dist = require.resolve('nest-distributed-lock').replace(/cjs\\/index\\.js$/, '');
      seen.oneScheduler = (await import(dist + 'lease-scheduler.js')).leaseScheduler === require(dist + 'cjs/lease-scheduler.js').leaseScheduler;

      // @Locked from the CommonJS build, in an app whose module comes from the ESM build: on a
      // provider Nest creates, and on an instance it never saw (bound through the fallback).
      class Jobs { async nightly(day) { return day; } }
      const descriptor = Object.getOwnPropertyDescriptor(Jobs.prototype, 'nightly');
      cjs.Locked('job:<day>', { wait: 0 })(Jobs.prototype, 'nightly', descriptor);
      Object.defineProperty(Jobs.prototype, 'nightly', descriptor);
      Injectable()(Jobs);
      class AppModule {}
      Module({ imports: [esm.DistributedLockModule.forRoot()], providers: [Jobs] })(AppModule);
      const nest = await NestFactory.createApplicationContext(AppModule, { logger: false });
      const locks = nest.get(esm.LockService);
      const job = await locks.acquire('job:mon');
      seen.provider = await nest.get(Jobs).nightly('mon').catch((e) => e.name);
      seen.unmanaged = await new Jobs().nightly('mon').catch((e) => e.name);
      await job.release();
      seen.afterRelease = await nest.get(Jobs).nightly('mon');
      await nest.close();
      console.log(JSON.stringify(seen));`,
    );
    const out = execFileSync(process.execPath, ['dual.mjs'], { cwd: app, encoding: 'utf8' });
    expect(JSON.parse(out.trim().split('\n').pop()!)).toEqual({
      files: ['nest-distributed-lock/dist/index.js', 'nest-distributed-lock/dist/cjs/index.js'],
      twoCopies: true,
      reentered: 'reentered',
      instanceOf: { sameClassOtherBuild: true, baseClassOtherBuild: true, sameBuild: true, unrelatedClass: false, plainError: false },
      oneScheduler: true,
      provider: 'LockNotAcquiredError',
      unmanaged: 'LockNotAcquiredError',
      afterRelease: 'mon',
    });
  }, 30_000);
});
