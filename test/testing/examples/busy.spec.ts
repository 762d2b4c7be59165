import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Param, ParseIntPipe, Post, type INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DistributedLockModule, Locked, LockService } from 'nest-distributed-lock';
import { recordLocks } from 'nest-distributed-lock/testing';
import request from 'supertest';

@Controller('orders')
export class OrdersController {
  @Post(':id/pay')
  @Locked('order:<id>', { wait: 0 })
  async pay(@Param('id', ParseIntPipe) id: number) {
    return { paid: id };
  }
}

@Injectable()
export class Nightly {
  runs = 0;

  // On one instance at a time; the others skip the tick.
  @Locked('job:nightly', { onBusy: 'skip' })
  async run() {
    this.runs++;
    return 'done';
  }
}

describe('a busy lock', () => {
  let app: INestApplication;
  let locks: LockService;

  beforeEach(async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [DistributedLockModule.forRoot()],
      controllers: [OrdersController],
      providers: [Nightly],
    }).compile();
    app = await moduleRef.createNestApplication({ logger: false }).init();
    locks = app.get(LockService);
  });

  afterEach(() => app.close());

  it('answers 409 with Retry-After while another holder has the order', async () => {
    // Held by the test, outside the request's async context: to the handler, another holder.
    await using held = await locks.acquire('order:42');
    const response = await request(app.getHttpServer()).post('/orders/42/pay').expect(409);
    expect(response.headers['retry-after']).toBe('1');
    expect(response.body).toMatchObject({ keys: held.keys }); // ['lock:order:42']: full keys, with the prefix
    await request(app.getHttpServer()).post('/orders/7/pay').expect(201); // other orders go on
  });

  it('skips the job while another instance runs it', async () => {
    const recorder = recordLocks(locks);
    const held = await locks.acquire('job:nightly');
    await expect(app.get(Nightly).run()).resolves.toBeUndefined();
    expect(app.get(Nightly).runs).toBe(0);
    expect(recorder.busy).toEqual(['job:nightly']);

    await held.release();
    await expect(app.get(Nightly).run()).resolves.toBe('done');
  });
});
