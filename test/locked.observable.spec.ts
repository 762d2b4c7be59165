import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { Controller, Get, Injectable, Module, Param, Sse, type INestApplication, type MessageEvent } from '@nestjs/common';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { interval, isObservable, lastValueFrom, map, Observable, Subject, takeUntil, throwError, timer } from 'rxjs';
import request from 'supertest';
import { DistributedLockModule, LockNotAcquiredError, LockService, Locked } from '../lib/index.js';
import { until } from './support/wait.js';

/** Counts the subscribers inside a section at once: more than one means the lock did not hold. */
class Section {
  inside = 0;
  most = 0;
  entered = 0;
  /** When set, what it returned at each entry. */
  probe: (() => boolean) | undefined;
  readonly enteredWhileProbed: boolean[] = [];

  /** A stream that stays inside the section until it completes, errors or is unsubscribed. */
  stream<T>(value: T, end: Observable<unknown> = timer(20)): Observable<T> {
    return new Observable<T>((subscriber) => {
      this.entered++;
      if (this.probe) this.enteredWhileProbed.push(this.probe());
      this.most = Math.max(this.most, ++this.inside);
      const sub = end.subscribe({ next: () => (subscriber.next(value), subscriber.complete()), error: (e) => subscriber.error(e) });
      return () => {
        this.inside--;
        sub.unsubscribe();
      };
    });
  }
}

@Injectable()
class Reports {
  readonly section = new Section();
  /** Ends the endless streams from the test. */
  readonly stop = new Subject<void>();
  constructor(readonly locks: LockService) {}

  @Locked('report:<id>')
  build(id: string): Observable<{ id: string }> {
    return this.section.stream({ id });
  }

  @Locked('report:<id>')
  async buildLater(id: string): Promise<Observable<{ id: string }>> {
    await Promise.resolve();
    return this.section.stream({ id });
  }

  @Locked('report:<id>', { wait: 0 })
  async quick(id: string): Promise<Observable<{ id: string }>> {
    return this.section.stream({ id });
  }

  @Locked('report:<id>')
  failing(id: string): Observable<never> {
    return throwError(() => new Error(`report ${id} failed`));
  }

  /** Subscriber code that calls a method locking the same key: it must re-enter, not wait. */
  @Locked('report:<id>')
  nested(id: string): Observable<readonly string[] | undefined> {
    return new Observable<string>((subscriber) => {
      this.inner(id).then(
        (keys) => (subscriber.next(keys), subscriber.complete()),
        (error: unknown) => subscriber.error(error),
      );
    }).pipe(map((keys) => keys as unknown as readonly string[] | undefined));
  }

  @Locked('report:<id>', { wait: 0 })
  async inner(id: string): Promise<string> {
    const handle = this.locks.current()!;
    return `${handle.keys.join(',')} reentrant=${handle.reentrant}`;
  }

  @Locked('report:<id>')
  endless(id: string): Observable<string> {
    return interval(5).pipe(
      map(() => id),
      takeUntil(this.stop),
    );
  }
}

@Controller('reports')
class ReportsController {
  constructor(private readonly reports: Reports) {}

  @Get(':id')
  @Locked('report:<id>')
  get(@Param('id') id: string): Observable<{ id: string }> {
    return this.reports.section.stream({ id });
  }

  @Get(':id/later')
  @Locked('report:<id>')
  async later(@Param('id') id: string): Promise<Observable<{ id: string }>> {
    return this.reports.section.stream({ id });
  }

  @Sse(':id/events')
  @Locked('report:<id>')
  events(@Param('id') id: string): Observable<MessageEvent> {
    return this.reports.section.stream({ data: id } as MessageEvent, this.reports.stop);
  }
}

@Module({ imports: [DistributedLockModule.forRoot()], providers: [Reports], controllers: [ReportsController] })
class AppModule {}

const platforms = ['express', 'fastify'] as const;

describe('@Locked on a method that returns an Observable', () => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    app?.get(Reports).stop.next();
    await app?.close();
    app = undefined;
  });

  async function boot(platform: (typeof platforms)[number] = 'express'): Promise<INestApplication> {
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    app =
      platform === 'fastify'
        ? moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(), { logger: false })
        : moduleRef.createNestApplication({ logger: false });
    await app.init();
    if (platform === 'fastify') await (app as NestFastifyApplication).getHttpAdapter().getInstance().ready();
    return app;
  }

  for (const platform of platforms) {
    describe(`on ${platform}`, () => {
      it('lets one request at a time into a handler whose Observable takes time', async () => {
        const app = await boot(platform);
        const server = app.getHttpServer();
        const answers = await Promise.all(Array.from({ length: 5 }, () => request(server).get('/reports/7')));
        expect(answers.map((a) => a.body)).toEqual(Array.from({ length: 5 }, () => ({ id: '7' })));
        const section = app.get(Reports).section;
        expect(section.entered).toBe(5);
        expect(section.most).toBe(1);
      });

      it('lets one request at a time into an async handler that resolves to an Observable', async () => {
        const app = await boot(platform);
        const server = app.getHttpServer();
        await Promise.all(Array.from({ length: 5 }, () => request(server).get('/reports/8/later').expect(200, { id: '8' })));
        expect(app.get(Reports).section.most).toBe(1);
      });

      it('holds the lock for an SSE stream and frees it when the client disconnects', async () => {
        const app = await boot(platform);
        await app.listen(0, '127.0.0.1');
        const { port } = app.getHttpServer().address() as AddressInfo;
        const locks = app.get(LockService);
        const client = http.get({ host: '127.0.0.1', port, path: '/reports/9/events' });
        const response = await new Promise<http.IncomingMessage>((resolve) => client.once('response', resolve));
        await new Promise((resolve) => response.once('data', resolve));
        expect(await locks.isLocked('report:9')).toBe(true);
        // A second client waits behind the first: the stream is inside the section.
        await expect(locks.tryAcquire('report:9')).resolves.toBeUndefined();
        client.destroy();
        await until(async () => !(await locks.isLocked('report:9')), 5_000, 'the lock to be freed after the client left');
        expect(app.get(Reports).section.inside).toBe(0);
      });
    });
  }

  it('returns an Observable from a method declared to return one, and locks nothing until it is subscribed', async () => {
    const app = await boot();
    const reports = app.get(Reports);
    const stream = reports.build('11');
    expect(isObservable(stream)).toBe(true);
    expect(await app.get(LockService).isLocked('report:11')).toBe(false);
    expect(await lastValueFrom(stream)).toEqual({ id: '11' });
    expect(reports.section.entered).toBe(1);
  });

  it('holds the lock from subscription to completion, one subscriber inside at a time', async () => {
    const reports = (await boot()).get(Reports);
    const results = await Promise.all(Array.from({ length: 5 }, () => lastValueFrom(reports.build('1'))));
    expect(results).toEqual(Array.from({ length: 5 }, () => ({ id: '1' })));
    expect(reports.section.most).toBe(1);
  });

  it('frees the lock when the stream errors', async () => {
    const app = await boot();
    const reports = app.get(Reports);
    await expect(lastValueFrom(reports.failing('2'))).rejects.toThrow('report 2 failed');
    expect(await app.get(LockService).isLocked('report:2')).toBe(false);
  });

  it('frees the lock when the subscriber unsubscribes mid-stream', async () => {
    const app = await boot();
    const locks = app.get(LockService);
    const subscription = app.get(Reports).endless('3').subscribe();
    await until(() => locks.isLocked('report:3'), 5_000, 'the stream to take the lock');
    subscription.unsubscribe();
    await until(async () => !(await locks.isLocked('report:3')), 5_000, 'the lock to be freed on unsubscribe');
  });

  it('runs the subscriber code holding the lock, so a nested @Locked call re-enters', async () => {
    const reports = (await boot()).get(Reports);
    expect(await lastValueFrom(reports.nested('4'))).toBe('lock:report:4 reentrant=true');
  });

  it('frees the lock of an Observable nobody subscribes to', async () => {
    const app = await boot();
    const locks = app.get(LockService);
    await app.get(Reports).buildLater('5');
    await until(async () => !(await locks.isLocked('report:5')), 5_000, 'the lock of an unsubscribed Observable to be freed');
  });

  it('locks anew for a subscription that comes after the lock was freed', async () => {
    const app = await boot();
    const locks = app.get(LockService);
    const reports = app.get(Reports);
    const stream = await reports.buildLater('6');
    await until(async () => !(await locks.isLocked('report:6')), 5_000, 'the lock of an unsubscribed Observable to be freed');
    const handle = await locks.acquire('report:6');
    reports.section.probe = () => handle.isHeld;
    const late = lastValueFrom(stream);
    await handle.release();
    expect(await late).toEqual({ id: '6' });
    // The late subscriber waited for the holder instead of running beside it.
    expect(reports.section.enteredWhileProbed).toEqual([false]);
  });

  it('fails a late subscription with LockNotAcquiredError when the lock stays busy', async () => {
    const app = await boot();
    const locks = app.get(LockService);
    const stream = await app.get(Reports).quick('10');
    await until(async () => !(await locks.isLocked('report:10')), 5_000, 'the lock of an unsubscribed Observable to be freed');
    const handle = await locks.acquire('report:10');
    await expect(lastValueFrom(stream)).rejects.toBeInstanceOf(LockNotAcquiredError);
    expect(app.get(Reports).section.entered).toBe(0);
    await handle.release();
  });

  it('holds the lock for an Observable returned to using()', async () => {
    const locks = (await boot()).get(LockService);
    const section = new Section();
    const streams = await Promise.all(Array.from({ length: 5 }, () => locks.using('job', () => section.stream('done'))));
    await Promise.all(streams.map((stream) => lastValueFrom(stream)));
    expect(section.most).toBe(1);
  });
});
