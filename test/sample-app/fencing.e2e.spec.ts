import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { LockService } from 'nest-distributed-lock';
import request from 'supertest';
import { ProductsRepository } from '../../sample-app/products.repository.js';
import { createShopApp } from '../../sample-app/shop.app.js';
import { until } from '../support/wait.js';

/**
 * The seeds' GC-pause story, in one process: a holder reads the stock, stalls past its lease, a
 * second buyer takes the lock and sells, then the first one's write arrives. The stall is a gate
 * in the repository; the lease lapses for real (short ttl, no watchdog).
 * shop-processes.e2e.spec.ts tells the same story with a real paused process (SIGSTOP).
 */
describe('fencing: a stale holder cannot overwrite a newer sale', () => {
  let app: INestApplication;
  let http: ReturnType<typeof request>;
  let repository: ProductsRepository;

  beforeAll(async () => {
    app = await createShopApp({ lockTtlMs: 200, lockAutoExtend: false }, false);
    await app.init();
    http = request(app.getHttpServer());
    repository = app.get(ProductsRepository);
  }, 60_000);

  afterAll(async () => {
    await app?.close();
  });

  /** The next readStock of `productId` returns its result only once `open()` is called. */
  function stallNextRead(productId: number) {
    const original = repository.readStock.bind(repository);
    let reached = false;
    let open!: () => void;
    const opened = new Promise<void>((resolve) => (open = resolve));
    repository.readStock = async (id: number) => {
      const stock = await original(id);
      if (id === productId) {
        repository.readStock = original;
        reached = true;
        await opened;
      }
      return stock;
    };
    return { reached: () => reached, open: () => open() };
  }

  it('the paused holder gets 409 STALE_FENCING_TOKEN; only the newer sale is in the database', async () => {
    const { body: product } = await http.post('/products').send({ name: 'fenced', stock: 10 }).expect(201);
    const locks = app.get(LockService);
    const stall = stallNextRead(product.id);

    const stale = http.post(`/products/${product.id}/purchase`).send({ quantity: 1 }).then((r) => r);
    await until(stall.reached, 5_000, 'the first buyer to read the stock under the lock');
    // Its lease lapses while it is stalled between read and write.
    await until(async () => !(await locks.isLocked(`product:${product.id}`)), 5_000, 'the stalled holder to lose its lease');

    const fresh = await http.post(`/products/${product.id}/purchase`).send({ quantity: 1 }).expect(201);
    expect(fresh.body.stockLeft).toBe(9);

    stall.open();
    const refused = await stale;
    expect(refused.status).toBe(409);
    expect(refused.body).toMatchObject({ code: 'STALE_FENCING_TOKEN', productId: product.id, lastToken: fresh.body.fencingToken });
    expect(refused.body.fencingToken).toBeLessThan(fresh.body.fencingToken);
    expect(refused.body.message).toMatch(/nothing was sold/);

    // Without the fence the stale write would land: stock 9 again, and two orders for one item.
    await http.get(`/products/${product.id}`).expect(200, { id: product.id, name: 'fenced', stock: 9, lastToken: fresh.body.fencingToken });
    expect(await repository.orderCount(product.id)).toBe(1);
  });

  it('the same stall on the unsafe endpoint loses a sale: what the fence prevents', async () => {
    const { body: product } = await http.post('/products').send({ name: 'unfenced', stock: 10 }).expect(201);
    const stall = stallNextRead(product.id);
    const slow = http.post(`/products/${product.id}/purchase/unsafe`).send({ quantity: 1 }).then((r) => r);
    await until(stall.reached, 5_000, 'the first buyer to read the stock');
    await http.post(`/products/${product.id}/purchase/unsafe`).send({ quantity: 1 }).expect(201);
    stall.open();
    expect((await slow).status).toBe(201);
    await http.get(`/products/${product.id}`).expect(200).expect((r) => expect(r.body.stock).toBe(9));
    expect(await repository.orderCount(product.id)).toBe(2);
  });
});
