import { describe, expect, it, beforeAll, afterAll } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '..');

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
    execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', join(root, 'tsconfig.build.json'), '--outDir', join(installed, 'dist')], { stdio: 'pipe' });
    const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { files: string[]; dependencies: Record<string, string> };
    writeFileSync(join(installed, 'package.json'), JSON.stringify(manifest));
    // The app's required peers and the package's own dependencies, from this repo's node_modules;
    // not the optional peers (ioredis, redlock): the package must load without them.
    // (Node resolves a symlinked package's own dependencies from its real path.)
    for (const dep of ['@nestjs', 'reflect-metadata', 'rxjs', ...Object.keys(manifest.dependencies)]) {
      symlinkSync(join(root, 'node_modules', dep), join(app, 'node_modules', dep));
    }
    expect(manifest.files).toEqual(['dist']);
  }, 60_000);

  afterAll(() => rmSync(app, { recursive: true, force: true }));

  it('ships type declarations next to the entry named in the exports map', () => {
    const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { exports: Record<string, Record<string, string>> };
    const entry = manifest.exports['.'];
    expect(existsSync(join(app, 'node_modules/nest-distributed-lock', entry.types))).toBe(true);
    expect(existsSync(join(app, 'node_modules/nest-distributed-lock', entry.import))).toBe(true);
  });

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
      script(`import 'reflect-metadata'; import * as lib from 'nest-distributed-lock'; import * as common from '@nestjs/common'; import * as core from '@nestjs/core';`),
    );
    const out = execFileSync(process.execPath, ['esm.mjs'], { cwd: app, encoding: 'utf8' });
    expect(JSON.parse(out.trim().split('\n').pop()!)).toEqual({ skipped: 'LockNotAcquiredError', ran: 'mon' });
  }, 30_000);

  it('says which package to install, at construction, when a backend needs an optional peer the app lacks', () => {
    writeFileSync(
      join(app, 'peers.mjs'),
      `import * as lib from 'nest-distributed-lock';
      const backends = {
        redis: () => new lib.RedisLockBackend('redis://127.0.0.1:6379'),
        redlock: () => new lib.RedlockLockBackend(['redis://127.0.0.1:6379']),
      };
      const seen = {};
      for (const [name, create] of Object.entries(backends)) {
        try { create(); seen[name] = 'created'; }
        catch (error) { seen[name] = { type: error.constructor.name, ours: error instanceof lib.DistributedLockError, message: error.message }; }
      }
      console.log(JSON.stringify(seen));`,
    );
    const seen = JSON.parse(execFileSync(process.execPath, ['peers.mjs'], { cwd: app, encoding: 'utf8' }).trim()) as Record<string, unknown>;
    expect(seen.redis).toEqual({ type: 'InvalidLockOptionsError', ours: true, message: expect.stringContaining('npm install ioredis') });
    expect(seen.redlock).toEqual({ type: 'InvalidLockOptionsError', ours: true, message: expect.stringContaining('npm install redlock@5.0.0-beta.2 ioredis') });
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
