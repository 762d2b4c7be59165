import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Injectable, Module, type CanActivate, type ExecutionContext, type INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DistributedLockModule, LockBoardModule, LockService, RedisLockBackend } from 'nest-distributed-lock';
import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { copyFileSync, mkdirSync, statSync } from 'node:fs';
import http from 'node:http';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { launchChromium } from '../support/chromium.js';
import { RedisServer } from '../support/redis-server.js';
import { until } from '../support/wait.js';

const ROOT = resolve(import.meta.dirname, '../..');
/** Screenshots of each step (ignored by git). */
const SCREENSHOTS = join(ROOT, '.tmp');
/** The image the README shows: `UPDATE_README_IMAGES=1` has this test replace it. */
const README_IMAGE = join(ROOT, 'docs/images/lock-board.png');
const COOKIE = { name: 'board', value: 'operator-cookie' };
/** A Redis user whose password must never reach the page. */
const SECRET = 'board-s3cret-pw';

@Injectable()
class OperatorGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest<{ headers: Record<string, string | undefined>; user?: unknown }>();
    if (!(req.headers.cookie ?? '').split(/;\s*/).includes(`${COOKIE.name}=${COOKIE.value}`)) return false;
    req.user = { username: 'ops-alice' };
    return true;
  }
}

interface WorkerMessage {
  type: 'ready' | 'acquired' | 'lost' | 'released' | 'failed';
  id?: string;
  token?: number;
  reason?: string;
  message?: string;
}

/** A child process with its own LockService on the same Redis (test/fixtures/board-lock-process.mjs). */
class Worker {
  readonly messages: WorkerMessage[] = [];
  readonly child: ChildProcess;

  constructor(url: string, instance: string) {
    this.child = fork(resolve(ROOT, 'test/fixtures/board-lock-process.mjs'), [url, instance, '1500'], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    this.child.on('message', (message: WorkerMessage) => this.messages.push(message));
  }

  hold(id: string, key: string, site: string): void {
    this.child.send({ type: 'hold', id, key, site });
  }

  release(id: string): void {
    this.child.send({ type: 'release', id });
  }

  async next(type: WorkerMessage['type'], id?: string): Promise<WorkerMessage> {
    const find = () => this.messages.find((m) => m.type === type && m.id === id);
    await until(() => find() !== undefined, 20_000, `${type} ${id ?? ''} from a worker`);
    return find()!;
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = once(this.child, 'exit');
    this.child.kill('SIGKILL');
    await exited;
  }
}

describe('the lock board in headless Chromium, two processes holding and waiting on Redis', () => {
  let redis: RedisServer;
  let url: string;
  let app: INestApplication;
  let locks: LockService;
  let base: string;
  let browser: Browser;
  let context: BrowserContext;
  let page: Page;
  let a: Worker;
  let b: Worker;

  beforeAll(async () => {
    redis = await RedisServer.start({ config: `user board on >${SECRET} ~* &* +@all\n` });
    url = `redis://board:${SECRET}@127.0.0.1:${redis.port}`;
    @Module({
      imports: [
        DistributedLockModule.forRoot({ backend: new RedisLockBackend(url), instance: 'board-app' }),
        LockBoardModule.forRoot({ guard: OperatorGuard, forceRelease: true }),
      ],
    })
    class BoardApp {}
    const moduleRef = await Test.createTestingModule({ imports: [BoardApp] }).compile();
    app = moduleRef.createNestApplication({ logger: ['error'] });
    await app.listen(0, '127.0.0.1');
    base = `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;
    locks = app.get(LockService);
    [a, b] = [new Worker(url, 'worker-a'), new Worker(url, 'worker-b')];
    browser = await launchChromium();
    context = await browser.newContext({ viewport: { width: 1200, height: 640 } });
    await context.addCookies([{ ...COOKIE, url: base }]);
    page = await context.newPage();
    page.on('dialog', (dialog) => void dialog.accept());
    await Promise.all([a.next('ready'), b.next('ready')]);
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    await Promise.all([a?.stop(), b?.stop()]);
    await app?.close();
    await redis?.stop();
  });

  // JSON's string escapes are CSS's: a key with quotes or markup still selects its own row.
  const row = (key: string) => page.locator(`#locks tr[data-key=${JSON.stringify(key)}]`);
  const texts = (key: string, cell: string, field: string) => row(key).locator(`td.${cell} [data-field="${field}"]`).allTextContents();
  /** How many waiters the store has in `key`'s line. */
  const lineLength = async (key: string) => (await locks.inspect(key))?.waiters?.length ?? 0;

  it('shows both holders with instance and site, and the waiters in the order they came', async () => {
    a.hold('a1', 'order:1', 'Checkout.pay');
    b.hold('b1', 'invoice:7', 'Billing.close');
    await Promise.all([a.next('acquired', 'a1'), b.next('acquired', 'b1')]);
    b.hold('b2', 'order:1', 'Refunds.issue');
    await until(async () => (await lineLength('order:1')) === 1, 10_000, "worker-b in order:1's line");
    a.hold('a2', 'order:1', 'Reports.run');
    await until(async () => (await lineLength('order:1')) === 2, 10_000, 'worker-a behind it');
    // A refusal seen by the board's own process: contention.
    expect(await locks.tryAcquire('order:1')).toBeUndefined();

    const response = await page.goto(`${base}/locks`);
    expect(response?.status()).toBe(200);
    await row('order:1').locator('ol.waiters li').nth(1).waitFor({ timeout: 10_000 });
    expect(await texts('order:1', 'holders', 'instance')).toEqual(['worker-a']);
    expect(await texts('order:1', 'holders', 'site')).toEqual(['Checkout.pay']);
    expect(await texts('order:1', 'line', 'instance')).toEqual(['worker-b', 'worker-a']);
    expect(await texts('order:1', 'line', 'site')).toEqual(['Refunds.issue', 'Reports.run']);
    expect(await texts('invoice:7', 'holders', 'instance')).toEqual(['worker-b']);
    expect(await texts('invoice:7', 'holders', 'site')).toEqual(['Billing.close']);
    await expect(row('order:1').locator('td.contention').textContent()).resolves.toMatch(/1 busy/);
    expect(Number((await texts('order:1', 'holders', 'token'))[0])).toBe((await a.next('acquired', 'a1')).token);

    mkdirSync(SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: join(SCREENSHOTS, 'lock-board.png') });
    expect(statSync(join(SCREENSHOTS, 'lock-board.png')).size).toBeGreaterThan(10_000);
    // The README's picture is this screenshot, replaced only when asked: a test run leaves the tree as it was.
    if (process.env.UPDATE_README_IMAGES === '1') copyFileSync(join(SCREENSHOTS, 'lock-board.png'), README_IMAGE);
  }, 30_000);

  it('follows a release within 2 s, without a reload: the next in line holds the key', async () => {
    a.release('a1');
    await a.next('released', 'a1');
    const released = performance.now();
    // The page stops showing worker-a as holder within 2 s of the release.
    await until(
      async () => !(await texts('order:1', 'holders', 'instance')).includes('worker-a'),
      2_000,
      'the page to drop the released holder',
    );
    process.stdout.write(`lock board: release shown after ${Math.round(performance.now() - released)} ms\n`);
    await b.next('acquired', 'b2');
    await until(async () => (await texts('order:1', 'holders', 'site')).join() === 'Refunds.issue', 10_000, 'worker-b as holder');
    expect(await texts('order:1', 'holders', 'instance')).toEqual(['worker-b']);
    expect(await texts('order:1', 'line', 'instance')).toEqual(['worker-a']);
    await page.screenshot({ path: join(SCREENSHOTS, 'lock-board-after-release.png') });
  }, 30_000);

  it("force release frees the key and the holder's signal aborts", async () => {
    await row('order:1').locator('button.release').click();
    const lost = await b.next('lost', 'b2');
    expect(lost.reason).toBe('taken');
    // Freed: the next in line (worker-a's second caller) takes it.
    await a.next('acquired', 'a2');
    await until(async () => (await texts('order:1', 'holders', 'site')).join() === 'Reports.run', 10_000, 'the next holder on the page');
    await expect(page.locator('#message').textContent()).resolves.toBe('Released order:1.');
    await page.screenshot({ path: join(SCREENSHOTS, 'lock-board-after-force-release.png') });
  }, 30_000);

  it('shows a key made of markup as text', async () => {
    const key = '<img src=x onerror="document.title=\'owned\'"><script>document.title="owned"</script>';
    const handle = await locks.acquire(key, { site: 'Markup.test' });
    try {
      await until(async () => (await row(key).count()) === 1, 5_000, 'the markup key on the page');
      expect(await row(key).locator('td.key').textContent()).toBe(key);
      expect(await page.locator('#locks img, #locks script').count()).toBe(0);
      await expect(page.title()).resolves.toBe('Locks · nest-distributed-lock');
    } finally {
      await handle.release();
    }
  }, 30_000);

  it('refuses an anonymous browser and an anonymous event stream; no password or address on the page', async () => {
    const anonymous = await browser.newContext();
    try {
      const refused = await (await anonymous.newPage()).goto(`${base}/locks`);
      expect(refused?.status()).toBe(403);
      await expect(refused!.text()).resolves.not.toMatch(/Locks/);
    } finally {
      await anonymous.close();
    }
    const status = await new Promise<number>((done, fail) =>
      http.get(`${base}/locks/api/stream`, (res) => (res.resume(), done(res.statusCode ?? 0))).on('error', fail),
    );
    expect(status).toBe(403);

    const seen = [await page.content(), JSON.stringify(await (await context.request.get(`${base}/locks/api/locks`)).json())].join('\n');
    expect(seen).toContain('worker-a');
    for (const secret of [SECRET, `:${redis.port}`, 'redis://']) expect(seen).not.toContain(secret);
  }, 30_000);
});
