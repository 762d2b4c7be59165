import type { CallHandler, ExecutionContext } from '@nestjs/common';
import { Mutex } from 'async-mutex';
import { EventEmitter } from 'node:events';
import { lastValueFrom, of } from 'rxjs';
import { performance } from 'node:perf_hooks';
import { LockInterceptor, LockService, MemoryLockBackend } from '../lib/index.js';
import { compareRates, round, settledHeap, type Report } from './harness.js';
import { Orders, ordersApp } from './orders.fixture.js';

/** In-memory backend: our cost per lock next to async-mutex, the usual in-process choice. */
export async function memoryBench(report: Report): Promise<void> {
  report.note('memory: acquire+release, @Locked overhead, heap after 1,000,000 cycles');
  const locks = new LockService();
  const mutex = new Mutex();

  const pairs = await compareRates({
    ours: async () => (await locks.acquire('k')).release(),
    'async-mutex': async () => (await mutex.acquire())(),
  });
  for (const [impl, opsPerSec] of Object.entries(pairs)) {
    report.add({
      scenario: 'memory: uncontended acquire+release',
      impl,
      opsPerSec: Math.round(opsPerSec),
      vsAsyncMutex: round(opsPerSec / pairs['async-mutex']),
    });
  }

  const app = await ordersApp();
  const orders = app.get(Orders);
  const calls = await compareRates({
    plain: () => orders.plain(1),
    '@Locked': () => orders.locked(1),
    'async-mutex runExclusive': () => mutex.runExclusive(() => orders.plain(1)),
  });
  const usPerCall = (impl: string) => 1e6 / calls[impl];
  for (const impl of Object.keys(calls)) {
    report.add({
      scenario: 'memory: method call overhead',
      impl,
      usPerCall: round(usPerCall(impl), 3),
      overheadUs: round(usPerCall(impl) - usPerCall('plain'), 3),
    });
  }
  await app.close();

  // What LockInterceptor (registered app-wide) adds to an HTTP request whose route takes no lock.
  const interceptor = new LockInterceptor(locks);
  const handler: CallHandler = { handle: () => of(1) };
  const request = () => {
    const response = Object.assign(new EventEmitter(), { writableFinished: false, destroyed: false });
    const context = { getType: () => 'http', getArgs: () => [], switchToHttp: () => ({ getResponse: () => response }) };
    return context as unknown as ExecutionContext;
  };
  const requests = await compareRates({
    'no interceptor': () => (request(), lastValueFrom(handler.handle())),
    LockInterceptor: () => lastValueFrom(interceptor.intercept(request(), handler)),
  });
  const usPerRequest = (impl: string) => 1e6 / requests[impl];
  for (const impl of Object.keys(requests)) {
    report.add({
      scenario: 'memory: HTTP request on a route without a lock',
      impl,
      usPerRequest: round(usPerRequest(impl), 3),
      overheadUs: round(usPerRequest(impl) - usPerRequest('no interceptor'), 3),
    });
  }

  const cycles = 1_000_000;
  const heap = async (impl: string, op: () => Promise<unknown>) => {
    for (let i = 0; i < 10_000; i++) await op(); // let JIT and pools settle first
    const before = settledHeap();
    for (let i = 0; i < cycles; i++) await op();
    const after = settledHeap();
    report.add({
      scenario: 'memory: heap growth after 1,000,000 cycles',
      impl,
      cycles,
      heapBeforeMB: round(before / 2 ** 20),
      growthKB: round((after - before) / 1024, 1),
    });
  };
  await heap('ours', async () => (await locks.acquire('k')).release());
  await heap('async-mutex', async () => (await mutex.acquire())());

  // Many keys, each locked a few times (orders, users): what is left must not grow with them.
  // 64 callers at a time, so some wait for a key another holds; a tenth keep it for minHold.
  const manyKeys = new LockService(new MemoryLockBackend());
  const distinct = 100_000;
  const acquisitions = 1_000_000;
  let done = 0;
  const worker = async () => {
    while (done < acquisitions) {
      done++;
      const key = `item:${Math.floor(Math.random() * distinct)}`;
      await manyKeys.using(key, () => undefined, done % 10 === 0 ? { minHold: 1 } : undefined);
    }
  };
  const keysBefore = settledHeap();
  const started = performance.now();
  await Promise.all(Array.from({ length: 64 }, worker));
  const seconds = (performance.now() - started) / 1000;
  await new Promise((resolve) => setTimeout(resolve, 5));
  const left = manyKeys.footprint();
  report.add({
    scenario: 'memory: 1,000,000 acquisitions over 100,000 keys',
    impl: 'ours',
    opsPerSec: Math.round(acquisitions / seconds),
    growthKB: round((settledHeap() - keysBefore) / 1024, 1),
    leasesLeft: left.leases + left.scheduled,
    queuesLeft: left.keySets,
    backendKeysLeft: (manyKeys.backend as MemoryLockBackend).footprint.keys,
  });
  await manyKeys.onApplicationShutdown();

  // What a caller waiting for a held lock costs (a request queued behind a hot key), and what
  // is left once those waits are aborted (their clients hung up).
  const waiters = 5_000;
  const holder = await locks.acquire('held');
  const hangUp = new AbortController();
  const before = settledHeap();
  const waiting = Array.from({ length: waiters }, () =>
    locks.acquire('held', { wait: 600_000, signal: hangUp.signal }).catch(() => undefined),
  );
  while (locks.queue.waiting < waiters) await new Promise((resolve) => setTimeout(resolve, 10));
  const during = settledHeap();
  hangUp.abort();
  await Promise.all(waiting);
  waiting.length = 0;
  report.add({
    scenario: 'memory: callers waiting for a held lock',
    impl: 'ours',
    waiters,
    bytesPerWaiter: Math.round((during - before) / waiters),
    leftAfterAbortKB: round((settledHeap() - before) / 1024, 1),
    queuedAfterAbort: locks.queue.waiting,
  });
  await holder.release();
  await locks.onApplicationShutdown();
}
