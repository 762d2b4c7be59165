import 'reflect-metadata';
import { afterEach, describe, expect, it } from '@jest/globals';
import {
  Body,
  CanActivate,
  Controller,
  ExecutionContext,
  Get,
  Injectable,
  Module,
  Param,
  ParseIntPipe,
  PipeTransform,
  Post,
  SetMetadata,
  UseGuards,
  type INestApplication,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import {
  DistributedLockModule,
  InvalidLockKeyError,
  LockNotAcquiredError,
  LockService,
  Locked,
  LockModuleNotImportedError,
} from '../lib/index.js';

const ROLE = 'test:role';
const Role = (role: string) => SetMetadata(ROLE, role);

/** A decorator that wraps the method before @Locked sees it, hiding its parameter names. */
function Wrapped(): MethodDecorator {
  return (_target, _key, descriptor) => {
    const inner = descriptor.value as unknown as (...args: unknown[]) => unknown;
    descriptor.value = function (this: unknown, ...args: unknown[]) {
      return inner.apply(this, args);
    } as never;
    return descriptor;
  };
}

@Injectable()
class ApiKeyGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    return context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-key'] === 'yes';
  }
}

/** Turns `{ order: ' 42 ' }` into `{ id: 42 }`: placeholders must see this, not the raw body. */
class OrderPipe implements PipeTransform {
  transform(value: { order: string }): { id: number } {
    return { id: Number(value.order.trim()) };
  }
}

@Injectable()
class Orders {
  constructor(private readonly locks: LockService) {}

  /** The key the current context holds: proves what the placeholder resolved to. */
  heldKeys(): readonly string[] | undefined {
    return this.locks.current()?.keys;
  }

  @Locked('order:<id>')
  async byName(id: string) {
    return this.heldKeys();
  }

  @Locked('order:<1>')
  async byIndex(_ignored: string, id: number) {
    return this.heldKeys();
  }

  @Locked('cart:<dto.items.0.sku>:<dto.owner.id>')
  async byPath(dto: { items: { sku: string }[]; owner: { id: number } }) {
    return this.heldKeys();
  }

  @Locked((from: string, to: string) => [`account:${to}`, `account:${from}`])
  async byFunction(from: string, to: string) {
    return this.heldKeys();
  }

  @Locked(['account:<from>', 'account:<to>'])
  async byArray(from: string, to: string) {
    return this.heldKeys();
  }

  @Locked('order:<id>')
  @Wrapped()
  async wrappedFirst(id: number, { note }: { note: string } = { note: '' }) {
    return [this.heldKeys(), note];
  }

  @Locked('order:<id>', { wait: 0, onBusy: 'skip' })
  async skipWhenBusy(id: number) {
    return 'ran';
  }

  @Locked('order:<id>', { wait: 0 })
  async ship(id: string) {
    return { shipped: id };
  }
}

@Controller('orders')
class OrdersController {
  constructor(
    private readonly orders: Orders,
    private readonly locks: LockService,
  ) {}

  @Get(':id')
  @Locked('order:<id>')
  @Role('reader')
  async get(@Param('id', ParseIntPipe) id: number) {
    return { keys: this.locks.current()?.keys, idType: typeof id };
  }

  @Post()
  @UseGuards(ApiKeyGuard)
  @Locked('order:<dto.id>')
  async create(@Body(new OrderPipe()) dto: { id: number }) {
    return { keys: this.locks.current()?.keys, token: this.locks.current()?.fencingToken };
  }

  @Post(':id/slow')
  @Locked('order:<id>', { wait: 0 })
  async slow(@Param('id') id: string) {
    return { id };
  }

  /** Not decorated itself: the lock is taken by the service it calls. */
  @Post(':id/ship')
  ship(@Param('id') id: string) {
    return this.orders.ship(id);
  }
}

@Module({ imports: [DistributedLockModule.forRoot()], providers: [Orders, ApiKeyGuard], controllers: [OrdersController] })
class AppModule {}

@Module({
  imports: [DistributedLockModule.forRoot({ retryAfter: (error) => (error.keys.includes('lock:order:9') ? 4_200 : 0) })],
  providers: [Orders, ApiKeyGuard],
  controllers: [OrdersController],
})
class RetryAfterModule {}

const platforms = [
  [
    'express',
    async (moduleRef: Awaited<ReturnType<ReturnType<typeof Test.createTestingModule>['compile']>>) =>
      moduleRef.createNestApplication({ logger: false }),
  ],
  [
    'fastify',
    async (moduleRef: Awaited<ReturnType<ReturnType<typeof Test.createTestingModule>['compile']>>) => {
      const app = moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(), { logger: false });
      return app;
    },
  ],
] as const;

describe('@Locked', () => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function boot(platform: (typeof platforms)[number][1] = platforms[0][1], module: unknown = AppModule): Promise<INestApplication> {
    const moduleRef = await Test.createTestingModule({ imports: [module as never] }).compile();
    app = await platform(moduleRef);
    await app.init();
    if (app.getHttpAdapter().getType() === 'fastify') await (app as NestFastifyApplication).getHttpAdapter().getInstance().ready();
    return app;
  }

  it('resolves <name>, <index>, <a.b.0.c>, functions and arrays from the arguments', async () => {
    const orders = (await boot()).get(Orders);
    expect(await orders.byName('7')).toEqual(['lock:order:7']);
    expect(await orders.byIndex('x', 8)).toEqual(['lock:order:8']);
    expect(await orders.byPath({ items: [{ sku: 'A-1' }], owner: { id: 3 } })).toEqual(['lock:cart:A-1:3']);
    // Sorted into one global order whatever order the keys were given in.
    expect(await orders.byFunction('b', 'a')).toEqual(['lock:account:a', 'lock:account:b']);
    expect(await orders.byArray('z', 'y')).toEqual(['lock:account:y', 'lock:account:z']);
  });

  it('reads parameter names when another decorator wrapped the method first', async () => {
    const orders = (await boot()).get(Orders);
    expect(orders.wrappedFirst.length).toBe(Orders.prototype.wrappedFirst.length);
    expect(await orders.wrappedFirst(5, { note: 'n' })).toEqual([['lock:order:5'], 'n']);
  });

  it('treats 1 and "1" as the same key', async () => {
    const app = await boot();
    const orders = app.get(Orders);
    const locks = app.get(LockService);
    const handle = await locks.acquire('order:1');
    expect(await orders.skipWhenBusy(1)).toBeUndefined();
    await handle.release();
    expect(await orders.skipWhenBusy(1)).toBe('ran');
  });

  it('keeps the method name and the metadata of other decorators', async () => {
    const app = await boot();
    const handler = OrdersController.prototype.get;
    expect(handler.name).toBe('get');
    expect(app.get(Reflector).get(ROLE, handler)).toBe('reader');
  });

  for (const [name, platform] of platforms) {
    describe(`on ${name}`, () => {
      it('routes @Get with ParseIntPipe, and resolves placeholders after the pipes ran', async () => {
        const server = (await boot(platform)).getHttpServer();
        const got = await request(server).get('/orders/12').expect(200);
        expect(got.body).toEqual({ keys: ['lock:order:12'], idType: 'number' });
        const created = await request(server).post('/orders').set('x-key', 'yes').send({ order: ' 42 ' }).expect(201);
        expect(created.body.keys).toEqual(['lock:order:42']);
        expect(typeof created.body.token).toBe('number');
      });

      it('runs guards on decorated handlers', async () => {
        const server = (await boot(platform)).getHttpServer();
        await request(server).post('/orders').send({ order: '1' }).expect(403);
      });

      it('answers 409 with Retry-After when the lock is busy, and leaves other errors alone', async () => {
        const app = await boot(platform);
        const handle = await app.get(LockService).acquire('order:9', { ttl: 4_500 });
        const busy = await request(app.getHttpServer()).post('/orders/9/slow').expect(409);
        expect(busy.body).toMatchObject({ statusCode: 409, error: 'Conflict', keys: ['lock:order:9'] });
        await handle.release();
        await request(app.getHttpServer()).post('/orders/9/slow').expect(201);
        // A business error (here a pipe's 400) passes through untouched.
        await request(app.getHttpServer()).get('/orders/not-a-number').expect(400);
      });

      it('answers 400 to a key value from the request that cannot name a lock, without echoing it', async () => {
        const app = await boot(platform);
        // A line break from the URL would forge a log line where the key is printed; a NUL is no id.
        for (const id of ['%0d%0aWARN%20forged', 'xxxxxxxxxx%00']) {
          const refused = await request(app.getHttpServer()).post(`/orders/${id}/slow`).expect(400);
          expect(refused.body).toMatchObject({ statusCode: 400, error: 'Bad Request' });
          expect(JSON.stringify(refused.body)).not.toMatch(/forged|xxxxxxxxxx/);
        }
      });

      it('suggests a retry in 1 s, not after the 30 s the watchdog keeps ahead of a running holder', async () => {
        const app = await boot(platform);
        const handle = await app.get(LockService).acquire('order:9'); // the default ttl, 30 s
        const busy = await request(app.getHttpServer()).post('/orders/9/slow').expect(409);
        expect(busy.headers['retry-after']).toBe('1');
        expect(busy.body.retryAfterMs).toBe(1_000);
        await handle.release();
      });

      it('suggests the retry the module option sets, per key', async () => {
        const app = await boot(platform, RetryAfterModule);
        const locks = app.get(LockService);
        const report = await locks.acquire('order:9');
        const other = await locks.acquire('order:7');
        const busy = await request(app.getHttpServer()).post('/orders/9/slow').expect(409);
        expect(busy.headers['retry-after']).toBe('5'); // 4 200 ms, rounded up
        expect(busy.body.retryAfterMs).toBe(4_200);
        const fixed = await request(app.getHttpServer()).post('/orders/7/ship').expect(409);
        expect(fixed.headers['retry-after']).toBe('0');
        await Promise.all([report.release(), other.release()]);
      });

      it('answers 409 too when the busy lock is met in a service the handler calls', async () => {
        const app = await boot(platform);
        const handle = await app.get(LockService).acquire('order:7', { ttl: 1_500 });
        const busy = await request(app.getHttpServer()).post('/orders/7/ship').expect(409);
        expect(busy.headers['retry-after']).toBe('1');
        expect(busy.body).toMatchObject({ statusCode: 409, keys: ['lock:order:7'] });
        await handle.release();
        await request(app.getHttpServer()).post('/orders/7/ship').expect(201, { shipped: '7' });
      });
    });
  }

  it('fails start-up on a template naming an unknown parameter, with class, method and template', async () => {
    @Injectable()
    class Broken {
      @Locked('order:<orderId>')
      async pay(id: string) {
        return id;
      }
    }
    @Module({ imports: [DistributedLockModule.forRoot()], providers: [Broken] })
    class BrokenModule {}
    const error = await boot(undefined, BrokenModule).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidLockKeyError);
    expect((error as Error).message).toContain('Broken.pay');
    expect((error as Error).message).toContain("'order:<orderId>'");
    expect((error as Error).message).toContain('(id)');
  });

  it('gives a rest parameter the array of the remaining arguments', async () => {
    @Injectable()
    class Accounts {
      constructor(readonly locks: LockService) {}
      @Locked(['account:<ids.0>', 'account:<ids.1>'])
      async transfer(...ids: string[]) {
        return this.locks.current()?.keys;
      }
      @Locked(['ledger:<book>', 'account:<ids.0>', 'account:<ids.1>'])
      async post(book: string, ...ids: string[]) {
        return this.locks.current()?.keys;
      }
    }
    @Module({ imports: [DistributedLockModule.forRoot()], providers: [Accounts] })
    class AccountsModule {}
    const accounts = (await boot(undefined, AccountsModule)).get(Accounts);
    expect(await accounts.transfer('alice', 'bob')).toEqual(['lock:account:alice', 'lock:account:bob']);
    expect(await accounts.post('main', 'alice', 'bob')).toEqual(['lock:account:alice', 'lock:account:bob', 'lock:ledger:main']);
  });

  it('with encodeKeyValues, argument lists that join to the same text lock different keys, and hash tags stay closed', async () => {
    @Injectable()
    class Orders2 {
      constructor(readonly locks: LockService) {}
      @Locked('order:<a>:<b>')
      async both(a: string, b: string) {
        return this.locks.current()!.keys[0];
      }
      @Locked('order:{<id>}:payment')
      async pay(id: string) {
        return this.locks.current()!.keys[0];
      }
    }
    const keysWith = async (encodeKeyValues: boolean) => {
      @Module({ imports: [DistributedLockModule.forRoot({ encodeKeyValues })], providers: [Orders2] })
      class EncodingModule {}
      const booted = await boot(undefined, EncodingModule);
      const orders = booted.get(Orders2);
      try {
        return [await orders.both('x:y', 'z'), await orders.both('x', 'y:z'), await orders.pay('a}b'), await orders.pay('42')];
      } finally {
        await booted.close();
      }
    };
    expect(await keysWith(false)).toEqual(['lock:order:x:y:z', 'lock:order:x:y:z', 'lock:order:{a}b}:payment', 'lock:order:{42}:payment']);
    expect(await keysWith(true)).toEqual([
      'lock:order:x%3Ay:z',
      'lock:order:x:y%3Az',
      'lock:order:{a%7Db}:payment',
      'lock:order:{42}:payment',
    ]);
  });

  it.each([
    [
      'a parameter with a default value',
      'report:<day>',
      /Reports\.run: template 'report:<day>' refers to parameter 'day', which has a default value/,
    ],
    ['a whole rest parameter', 'account:<ids>', /Reports\.run: template 'account:<ids>' refers to the rest parameter 'ids'/],
  ])('fails start-up on a template naming %s, saying what to write instead', async (_what, template, message) => {
    @Injectable()
    class Reports {
      @Locked(template)
      async run(day = 'today', ...ids: string[]) {
        return [day, ids];
      }
    }
    @Module({ imports: [DistributedLockModule.forRoot()], providers: [Reports] })
    class ReportsModule {}
    const error = await boot(undefined, ReportsModule).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidLockKeyError);
    expect((error as Error).message).toMatch(message);
  });

  it('locks static methods like instance methods, checked at start-up and named Class.method', async () => {
    // eslint-disable-next-line prefer-const -- assigned below once the app is up, read by the static method
    let locks: LockService | undefined;
    @Injectable()
    class Nightly {
      @Locked('nightly:<day>')
      static async run(day: string) {
        return locks?.current()?.keys;
      }
    }
    @Module({ imports: [DistributedLockModule.forRoot()], providers: [Nightly] })
    class NightlyModule {}
    const nightlyApp = await boot(undefined, NightlyModule);
    locks = nightlyApp.get(LockService);
    expect(await Nightly.run('monday')).toEqual(['lock:nightly:monday']);
    await nightlyApp.close();

    @Injectable()
    class BrokenStatic {
      @Locked('nightly:<date>')
      static async run(day: string) {
        return day;
      }
    }
    @Module({ imports: [DistributedLockModule.forRoot()], providers: [BrokenStatic] })
    class BrokenStaticModule {}
    const error = await boot(undefined, BrokenStaticModule).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidLockKeyError);
    expect((error as Error).message).toContain('BrokenStatic.run');
    expect((error as Error).message).toContain('(day)');
  });

  it('runs a static @Locked method with the service of the app that declared its class', async () => {
    @Injectable()
    class Nightly {
      @Locked('nightly:<day>', { wait: 0 })
      static async run(day: string) {
        return day;
      }
    }
    @Module({ imports: [DistributedLockModule.forRoot()], providers: [Nightly] })
    class NightlyModule {}
    @Module({ imports: [DistributedLockModule.forRoot()] })
    class OtherModule {}
    const nightlyApp = await Test.createTestingModule({ imports: [NightlyModule] }).compile();
    await nightlyApp.init();
    // Started later, so without a binding the class would fall back to this app's service.
    const other = await Test.createTestingModule({ imports: [OtherModule] }).compile();
    await other.init();
    try {
      const handle = await nightlyApp.get(LockService).acquire('nightly:friday');
      await expect(Nightly.run('friday')).rejects.toBeInstanceOf(LockNotAcquiredError);
      await handle.release();
      expect(await Nightly.run('friday')).toBe('friday');
    } finally {
      await other.close();
      await nightlyApp.close();
    }
  });

  it('refuses to run where DistributedLockModule is not imported', async () => {
    @Injectable()
    class Lonely {
      @Locked('job')
      async run() {
        return 'ran';
      }
    }
    @Module({ providers: [Lonely] })
    class LonelyModule {}
    const lonely = (await boot(undefined, LonelyModule)).get(Lonely);
    const error = await lonely.run().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockModuleNotImportedError);
    expect((error as Error).message).toContain('DistributedLockModule.forRoot()');
  });
});
