import { describe, expect, it } from '@jest/globals';
import { BadRequestException, ConflictException, type CallHandler, type ExecutionContext } from '@nestjs/common';
import { RpcException } from '@nestjs/microservices';
import { WsException } from '@nestjs/websockets';
import { EventEmitter } from 'node:events';
import { from, lastValueFrom, throwError } from 'rxjs';
import {
  LockConflictGraphQLError,
  LockInterceptor,
  LockNotAcquiredError,
  LockService,
  MemoryLockBackend,
  type DistributedLockModuleOptions,
} from '../lib/index.js';
import { until } from './support/wait.js';

function contextOf(type: string, response?: object): ExecutionContext {
  return {
    getType: () => type,
    getArgs: () => [],
    switchToHttp: () => ({ getResponse: () => response, getRequest: () => ({}) }),
  } as unknown as ExecutionContext;
}

function failWith(error: unknown): CallHandler {
  return { handle: () => throwError(() => error) };
}

async function intercepted(type: string, error: unknown, response?: object, options?: DistributedLockModuleOptions): Promise<unknown> {
  const interceptor = new LockInterceptor(options && new LockService(new MemoryLockBackend(), options));
  return lastValueFrom(interceptor.intercept(contextOf(type, response), failWith(error))).catch((e: unknown) => e);
}

/** The Retry-After header and the body's retryAfterMs an HTTP client gets for `error`. */
async function retryAfterOf(error: LockNotAcquiredError, options?: DistributedLockModuleOptions) {
  const headers: Record<string, string> = {};
  const mapped = await intercepted('http', error, { header: (name: string, value: string) => (headers[name] = value) }, options);
  return { header: headers['Retry-After'], ms: ((mapped as ConflictException).getResponse() as { retryAfterMs: number }).retryAfterMs };
}

describe('LockInterceptor', () => {
  const busy = new LockNotAcquiredError(['lock:order:1'], 250, 2_100);

  it('maps to RpcException with the conflict body for microservices', async () => {
    const error = await intercepted('rpc', busy);
    expect(error).toBeInstanceOf(RpcException);
    expect((error as RpcException).getError()).toMatchObject({ statusCode: 409, keys: ['lock:order:1'], retryAfterMs: 1_000 });
  });

  it('maps to WsException for gateways', async () => {
    const error = await intercepted('ws', busy);
    expect(error).toBeInstanceOf(WsException);
    expect((error as WsException).getError()).toMatchObject({ statusCode: 409, error: 'Conflict' });
  });

  it('maps to 409 with Retry-After on HTTP', async () => {
    const headers: Record<string, string> = {};
    const error = await intercepted('http', busy, { header: (name: string, value: string) => (headers[name] = value) });
    expect(error).toBeInstanceOf(ConflictException);
    expect(headers['Retry-After']).toBe('1');
  });

  it("suggests the holder's remaining lease, at most 1 s, by default", async () => {
    expect(await retryAfterOf(new LockNotAcquiredError(['lock:a'], 0, 29_000))).toEqual({ header: '1', ms: 1_000 });
    expect(await retryAfterOf(new LockNotAcquiredError(['lock:a'], 0, 300))).toEqual({ header: '1', ms: 300 });
    expect(await retryAfterOf(new LockNotAcquiredError(['lock:a'], 0))).toEqual({ header: '1', ms: 1_000 });
  });

  it('suggests the module option: a number, or what a function returns, rounded up to whole seconds', async () => {
    expect(await retryAfterOf(busy, { retryAfter: 2_500 })).toEqual({ header: '3', ms: 2_500 });
    expect(await retryAfterOf(busy, { retryAfter: 0 })).toEqual({ header: '0', ms: 0 });
    const byKey = { retryAfter: (error: LockNotAcquiredError) => (error.keys[0].startsWith('lock:report:') ? 60_000 : 2_000) };
    expect(await retryAfterOf(new LockNotAcquiredError(['lock:report:daily'], 0, 29_000), byKey)).toEqual({ header: '60', ms: 60_000 });
    expect(await retryAfterOf(busy, byKey)).toEqual({ header: '2', ms: 2_000 });
    // A function that returns no usable number does not turn the 409 into a 500: the default applies.
    expect(await retryAfterOf(busy, { retryAfter: () => Number.NaN })).toEqual({ header: '1', ms: 1_000 });
  });

  it("maps to an error with extensions.code 'LOCK_CONFLICT' for GraphQL, and to a ConflictException for other context types", async () => {
    const error = await intercepted('graphql', busy);
    expect(error).toBeInstanceOf(LockConflictGraphQLError);
    expect((error as LockConflictGraphQLError).extensions).toEqual({
      code: 'LOCK_CONFLICT',
      statusCode: 409,
      error: 'Conflict',
      keys: ['lock:order:1'],
      retryAfterMs: 1_000,
    });
    expect(await intercepted('kafka-streams', busy)).toBeInstanceOf(ConflictException);
  });

  it('passes other errors through untouched', async () => {
    const business = new BadRequestException('out of stock');
    expect(await intercepted('http', business, {})).toBe(business);
    expect(await intercepted('rpc', business)).toBe(business);
  });

  it('watches an HTTP response for a hang-up only once a wait for a lock starts, and stops when the handler is done', async () => {
    const locks = new LockService(new MemoryLockBackend(), { wait: 60_000 });
    const interceptor = new LockInterceptor(locks);
    const response = Object.assign(new EventEmitter(), { writableFinished: false, destroyed: false });
    const handling = (work: () => Promise<unknown>) =>
      lastValueFrom(interceptor.intercept(contextOf('http', response), { handle: () => from(work()) }));

    // A route that takes no lock: nothing listens to the response.
    let listening = -1;
    await handling(async () => (listening = response.listenerCount('close')));
    expect(listening).toBe(0);

    // A route whose lock is busy: its wait listens, a hang-up ends it, and nothing is left after.
    const holder = await locks.acquire('order:1');
    const waited = handling(() => locks.using('order:1', () => 'ran')).catch((error: unknown) => error);
    await until(() => locks.queue.waiting === 1, 5_000, 'the request to wait for the lock');
    expect(response.listenerCount('close')).toBe(1);
    response.emit('close');
    expect(await waited).toMatchObject({ status: 499 });
    expect(response.listenerCount('close')).toBe(0);
    expect(locks.queue.waiting).toBe(0);
    await holder.release();
    await locks.onApplicationShutdown();
  });
});
