import { describe, expect, it } from '@jest/globals';
import { BadRequestException, ConflictException, type CallHandler, type ExecutionContext } from '@nestjs/common';
import { RpcException } from '@nestjs/microservices';
import { WsException } from '@nestjs/websockets';
import { lastValueFrom, throwError } from 'rxjs';
import { LockInterceptor, LockNotAcquiredError } from '../lib/index.js';

function contextOf(type: string, response?: object): ExecutionContext {
  return {
    getType: () => type,
    switchToHttp: () => ({ getResponse: () => response, getRequest: () => ({}) }),
  } as unknown as ExecutionContext;
}

function failWith(error: unknown): CallHandler {
  return { handle: () => throwError(() => error) };
}

async function intercepted(type: string, error: unknown, response?: object): Promise<unknown> {
  return lastValueFrom(new LockInterceptor().intercept(contextOf(type, response), failWith(error))).catch((e: unknown) => e);
}

describe('LockInterceptor', () => {
  const busy = new LockNotAcquiredError(['lock:order:1'], 250, 2_100);

  it('maps to RpcException with the conflict body for microservices', async () => {
    const error = await intercepted('rpc', busy);
    expect(error).toBeInstanceOf(RpcException);
    expect((error as RpcException).getError()).toMatchObject({ statusCode: 409, keys: ['lock:order:1'], retryAfterMs: 2_100 });
  });

  it('maps to WsException for gateways', async () => {
    const error = await intercepted('ws', busy);
    expect(error).toBeInstanceOf(WsException);
    expect((error as WsException).getError()).toMatchObject({ statusCode: 409, error: 'Conflict' });
  });

  it('maps to 409 with Retry-After rounded up to whole seconds on HTTP', async () => {
    const headers: Record<string, string> = {};
    const error = await intercepted('http', busy, { header: (name: string, value: string) => (headers[name] = value) });
    expect(error).toBeInstanceOf(ConflictException);
    expect(headers['Retry-After']).toBe('3');
  });

  it('maps to a ConflictException for GraphQL and other context types', async () => {
    expect(await intercepted('graphql', busy)).toBeInstanceOf(ConflictException);
  });

  it('passes other errors through untouched', async () => {
    const business = new BadRequestException('out of stock');
    expect(await intercepted('http', business, {})).toBe(business);
    expect(await intercepted('rpc', business)).toBe(business);
  });
});
