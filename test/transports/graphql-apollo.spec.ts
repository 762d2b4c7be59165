import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { Module, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Args, GraphQLModule, Mutation, Query, Resolver } from '@nestjs/graphql';
import type { AddressInfo } from 'node:net';
import { DistributedLockModule, LockService, Locked } from '../../lib/index.js';
import { ErrorLog } from '../support/error-log.js';

@Resolver()
class OrdersResolver {
  @Query(() => Boolean)
  ready(): boolean {
    return true;
  }

  @Mutation(() => String)
  @Locked('order:<id>', { wait: 0 })
  async pay(@Args('id') id: string): Promise<string> {
    return `paid ${id}`;
  }
}

@Module({
  imports: [
    DistributedLockModule.forRoot({ ttl: 60_000 }),
    GraphQLModule.forRoot<ApolloDriverConfig>({
      driver: ApolloDriver,
      typeDefs: 'type Query { ready: Boolean! } type Mutation { pay(id: String!): String! }',
    }),
  ],
  providers: [OrdersResolver],
})
class OrdersModule {}

const apps: INestApplication[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((app) => app.close()));
});

interface GraphQLResponse {
  status: number;
  body: { data?: unknown; errors?: Array<{ message: string; path?: string[]; extensions?: Record<string, unknown> }> };
}

async function post(port: number, query: string): Promise<GraphQLResponse> {
  const response = await fetch(`http://127.0.0.1:${port}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ query }),
  });
  return { status: response.status, body: (await response.json()) as GraphQLResponse['body'] };
}

describe('a busy lock over GraphQL (Apollo), with a real HTTP request', () => {
  it('is an error with extensions.code LOCK_CONFLICT and the retry hint, not INTERNAL_SERVER_ERROR', async () => {
    const log = new ErrorLog();
    const app = await NestFactory.create(OrdersModule, { logger: log, abortOnError: false });
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    const { port } = app.getHttpServer().address() as AddressInfo;

    expect((await post(port, 'mutation { pay(id: "1") }')).body).toEqual({ data: { pay: 'paid 1' } });

    const held = await app.get(LockService).acquire('order:1');
    const busy = await post(port, 'mutation { pay(id: "1") }').finally(() => held.release());
    expect(busy.body.errors).toEqual([
      expect.objectContaining({
        path: ['pay'],
        extensions: expect.objectContaining({
          code: 'LOCK_CONFLICT',
          statusCode: 409,
          keys: ['lock:order:1'],
          retryAfterMs: expect.any(Number),
        }),
      }),
    ]);
    expect(busy.body.errors?.[0].message).toMatch(/^Lock not acquired: lock:order:1/);
    expect(log.errors).toEqual([]);
  });

  it('answers a key the request cannot name as BAD_REQUEST', async () => {
    const app = await NestFactory.create(OrdersModule, { logger: new ErrorLog(), abortOnError: false });
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    const { port } = app.getHttpServer().address() as AddressInfo;
    const bad = await post(port, 'mutation { pay(id: "") }');
    expect(bad.body.errors).toEqual([expect.objectContaining({ extensions: expect.objectContaining({ code: 'BAD_REQUEST' }) })]);
  });
});
