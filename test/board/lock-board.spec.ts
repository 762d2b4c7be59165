import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Injectable, Module, type CanActivate, type ExecutionContext, type INestApplication, type LoggerService } from '@nestjs/common';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import {
  DistributedLockModule,
  InvalidLockOptionsError,
  LockBoardModule,
  LockService,
  type LockBoardSnapshot,
  type LockHandle,
} from 'nest-distributed-lock';
import { recordLocks } from 'nest-distributed-lock/testing';
import http from 'node:http';
import request from 'supertest';

/** Lets in a request that carries the operator's cookie, as an app's session guard would, and names the user. */
@Injectable()
class OperatorGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest<{ headers: Record<string, string | undefined>; user?: unknown }>();
    if (!/(?:^|;\s*)board=operator-cookie(?:;|$)/.test(req.headers.cookie ?? '')) return false;
    req.user = { username: 'ops-alice' };
    return true;
  }
}

@Module({
  imports: [
    DistributedLockModule.forRoot({ instance: 'api-1', ttl: 900 }),
    // The read-only board, and a second one that can force a release, each behind the guard.
    LockBoardModule.forRoot({ guard: OperatorGuard, refreshMs: 200 }),
    LockBoardModule.forRoot({ path: '/admin/locks', guard: OperatorGuard, forceRelease: true }),
  ],
})
class BoardApp {}

/** Nest's log lines, for the force-release line. */
class RecordingLogger implements LoggerService {
  readonly lines: string[] = [];
  log = (message: unknown) => void this.lines.push(String(message));
  warn = (message: unknown) => void this.lines.push(String(message));
  error = (message: unknown) => void this.lines.push(String(message));
}

const COOKIE = 'board=operator-cookie';

/** The first `data:` event of an SSE response, then the connection is closed. */
function firstEvent(port: number, path: string, cookie?: string): Promise<{ status: number; type?: string; data?: unknown }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path, headers: cookie ? { cookie } : {} }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        resolve({ status: res.statusCode ?? 0, type: res.headers['content-type'] });
        return;
      }
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        text += chunk;
        const line = text.split('\n').find((l) => l.startsWith('data: ') && text.includes('\n\n'));
        if (!line) return;
        req.destroy();
        resolve({ status: 200, type: res.headers['content-type'], data: JSON.parse(line.slice(6)) });
      });
    });
    req.on('error', reject);
  });
}

describe.each(['express', 'fastify'] as const)('LockBoardModule on %s', (platform) => {
  let app: INestApplication;
  let locks: LockService;
  let port: number;
  const logger = new RecordingLogger();
  const agent = () => request(app.getHttpServer());

  beforeAll(async () => {
    const moduleRef = await Test.createTestingModule({ imports: [BoardApp] }).compile();
    app =
      platform === 'fastify'
        ? moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(), { logger })
        : moduleRef.createNestApplication({ logger });
    await app.listen(0, '127.0.0.1');
    port = (app.getHttpServer().address() as { port: number }).port;
    locks = app.get(LockService);
  });

  afterAll(async () => {
    await app?.close();
  });

  it('refuses an anonymous request on every route: page, JSON, event stream, force release', async () => {
    await agent().get('/locks').expect(403);
    await agent().get('/locks/api/locks').expect(403);
    expect(await firstEvent(port, '/locks/api/stream')).toMatchObject({ status: 403 });
    await agent().get('/admin/locks').expect(403);
    await agent().post('/admin/locks/api/release').send({ key: 'order:1' }).expect(403);
    // A wrong cookie is anonymous too.
    await agent().get('/locks/api/locks').set('cookie', 'board=guess').expect(403);
  });

  it('serves one self-contained page: inline style and script only, pinned by its CSP', async () => {
    const page = await agent().get('/locks').set('cookie', COOKIE).expect(200);
    expect(page.headers['content-type']).toMatch(/^text\/html/);
    expect(page.headers['content-security-policy']).toMatch(/default-src 'none'.*script-src 'sha256-/);
    expect(page.text).not.toMatch(/<(script|link|img)[^>]+(src|href)=/i);
    expect(page.text).not.toMatch(/https?:\/\//);
  });

  it('lists held keys with holder instance, site, age, lease, token and the line in order', async () => {
    const recorder = recordLocks(locks);
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const holder = locks.using('order:1', () => held, { site: 'Checkout.pay' });
    await recorder.waitFor('acquired', 'order:1');
    const waiter = locks.using('order:1', () => undefined, { site: 'Refunds.issue', wait: 10_000 });
    await locks.tryAcquire('order:1', { site: 'Report.run' }); // busy: counted as contention
    try {
      const { body } = await agent().get('/locks/api/locks').set('cookie', COOKIE).expect(200);
      const snapshot = body as LockBoardSnapshot;
      expect(snapshot).toMatchObject({ backend: 'memory', instance: 'api-1', listing: true, forceRelease: false });
      expect(snapshot.locks).toHaveLength(1);
      const [row] = snapshot.locks;
      expect(row).toMatchObject({ key: 'order:1', mode: 'exclusive', limit: 1, contention: { busy: 1 } });
      expect(row.holders).toEqual([
        {
          id: expect.any(String),
          instance: 'api-1',
          site: 'Checkout.pay',
          ageMs: expect.any(Number),
          ttlMs: expect.any(Number),
          fencingToken: expect.any(Number),
          here: true,
        },
      ]);
      expect(row.waiters).toEqual([{ instance: 'api-1', site: 'Refunds.issue', waitingMs: expect.any(Number), mode: 'exclusive' }]);
      expect(JSON.stringify(body)).not.toMatch(/owner/);
    } finally {
      release();
      await Promise.all([holder, waiter]);
    }
    const { body } = await agent().get('/locks/api/locks').set('cookie', COOKIE).expect(200);
    expect(body.locks).toEqual([]);
    // The waiter waited for the key and got it: a wait in the contention counts, kept after the key is free.
    expect(body.contended).toEqual([{ key: 'order:1', waits: 1, busy: 1, lost: 0 }]);
  });

  it('filters by prefix', async () => {
    const handles: LockHandle[] = await Promise.all(['order:7', 'order:8', 'invoice:7'].map((key) => locks.acquire(key)));
    try {
      const { body } = await agent().get('/locks/api/locks').query({ prefix: 'order:' }).set('cookie', COOKIE).expect(200);
      expect(body.locks.map((row: { key: string }) => row.key)).toEqual(['order:7', 'order:8']);
      const all = await agent().get('/locks/api/locks').set('cookie', COOKIE).expect(200);
      expect(all.body.locks.map((row: { key: string }) => row.key)).toEqual(['invoice:7', 'order:7', 'order:8']);
    } finally {
      await Promise.all(handles.map((handle) => handle.release()));
    }
  });

  it('streams snapshots as server-sent events to a guarded request', async () => {
    const handle = await locks.acquire('stream:1', { site: 'Stream.test' });
    try {
      const event = await firstEvent(port, '/locks/api/stream?prefix=stream:', COOKIE);
      expect(event).toMatchObject({ status: 200, type: expect.stringMatching(/^text\/event-stream/) });
      expect((event.data as LockBoardSnapshot).locks.map((row) => [row.key, row.holders[0].site])).toEqual([['stream:1', 'Stream.test']]);
    } finally {
      await handle.release();
    }
  });

  it('has no release route unless forceRelease is on', async () => {
    await agent().post('/locks/api/release').set('cookie', COOKIE).send({ key: 'order:1' }).expect(404);
  });

  it("force release frees the key, is logged with who and what, and the holder's signal aborts", async () => {
    const recorder = recordLocks(locks);
    const handle = await locks.acquire('order:42', { site: 'Checkout.pay' });
    const aborted = new Promise((resolve) => handle.signal.addEventListener('abort', () => resolve(handle.signal.reason)));
    // Another holder's id (one the operator saw before this one) frees nothing.
    const earlier = await locks.acquire('order:41');
    const earlierId = (await locks.inspect('order:41'))!.holders[0].id;
    await earlier.release();
    await agent().post('/admin/locks/api/release').set('cookie', COOKIE).send({ key: 'order:42', holder: earlierId }).expect(404);
    expect(await locks.isLocked('order:42')).toBe(true);

    const { id } = (await locks.inspect('order:42'))!.holders[0];
    expect(id).not.toBe(earlierId);
    const { body } = await agent().post('/admin/locks/api/release').set('cookie', COOKIE).send({ key: 'order:42', holder: id }).expect(200);
    expect(body).toEqual({ released: [{ instance: 'api-1', site: 'Checkout.pay', fencingToken: handle.fencingToken }] });
    expect(await locks.isLocked('order:42')).toBe(false);
    expect(logger.lines).toContainEqual(
      expect.stringMatching(/^Force release of 'order:42' by ops-alice \(.+\): took it from api-1 at Checkout\.pay token \d+/),
    );
    // Learnt at the next extension (a third of the 900 ms ttl), as with any takeover.
    await expect(aborted).resolves.toMatchObject({ name: 'LockLostError', reason: 'taken' });
    await recorder.waitFor('lost', 'order:42');
    expect(handle.isHeld).toBe(false);
  });

  it('refuses a release that is not a JSON object naming a key', async () => {
    const post = () => agent().post('/admin/locks/api/release').set('cookie', COOKIE);
    await post().set('content-type', 'application/x-www-form-urlencoded').send('key=order:1').expect(415);
    await post().send({ key: '' }).expect(400);
    await post().send({ key: 'order:1', fencingToken: 'x' }).expect(400);
    await post().send({ key: 'order:1', owner: 'x' }).expect(400);
    await post().send({ key: 'order:1' }).expect(400);
    await post().send({ key: 'order:nobody', holder: 'x' }).expect(404);
  });
});

describe('LockBoardModule.forRoot options', () => {
  it('refuses forceRelease without a guard, and a path that is not one', () => {
    expect(() => LockBoardModule.forRoot({ forceRelease: true })).toThrow(InvalidLockOptionsError);
    expect(() => LockBoardModule.forRoot({ forceRelease: true })).toThrow(/needs a 'guard'/);
    expect(() => LockBoardModule.forRoot({ path: '/locks?x=<y>' })).toThrow(/option 'path' must be a URL path/);
    expect(() => LockBoardModule.forRoot({ refreshMs: 5 })).toThrow(/option 'refreshMs'/);
    expect(() => LockBoardModule.forRoot({ gaurd: OperatorGuard } as never)).toThrow(/unknown option 'gaurd'/);
  });
});

describe('LockBoardModule at shutdown', () => {
  it.each(['express', 'fastify'] as const)(
    'ends open event streams on %s, so a page left open does not hold up app.close()',
    async (platform) => {
      @Module({ imports: [DistributedLockModule.forRoot(), LockBoardModule.forRoot({ guard: OperatorGuard })] })
      class ShutdownApp {}
      const moduleRef = await Test.createTestingModule({ imports: [ShutdownApp] }).compile();
      const app =
        platform === 'fastify'
          ? moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(), { logger: false })
          : moduleRef.createNestApplication({ logger: false });
      await app.listen(0, '127.0.0.1');
      const { port } = app.getHttpServer().address() as { port: number };
      let started!: () => void;
      const streaming = new Promise<void>((resolve) => (started = resolve));
      const ended = new Promise<string>((resolve, reject) => {
        http
          .get({ host: '127.0.0.1', port, path: '/locks/api/stream', headers: { cookie: COOKIE } }, (res) => {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (chunk: string) => {
              text += chunk;
              if (text.includes('data: ')) started();
            });
            res.on('end', () => resolve(text));
            res.on('error', reject);
          })
          .on('error', reject);
      });
      await streaming;
      await app.close();
      await expect(ended).resolves.toMatch(/^data: /m);
    },
  );
});

describe('LockBoardModule without a guard', () => {
  it('serves the page and warns at start-up that it is open to whoever reaches the app', async () => {
    @Module({ imports: [DistributedLockModule.forRoot(), LockBoardModule.forRoot({ path: 'ops/locks/' })] })
    class OpenApp {}
    const logger = new RecordingLogger();
    const moduleRef = await Test.createTestingModule({ imports: [OpenApp] }).compile();
    const app = moduleRef.createNestApplication({ logger });
    await app.init();
    try {
      expect(logger.lines).toContainEqual(expect.stringMatching(/^The lock board at \/ops\/locks has no guard of its own/));
      await request(app.getHttpServer()).get('/ops/locks').expect(200);
    } finally {
      await app.close();
    }
  });
});
