import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { LockService } from 'nest-distributed-lock';
import request from 'supertest';
import type { PriceList } from '../../sample-app/price-list.service.js';
import { PriceListRepository } from '../../sample-app/price-list.repository.js';
import { createShopApp } from '../../sample-app/shop.app.js';

/**
 * The shop's price list: rebuilt in place under an exclusive lock, read under a shared one by
 * GET /prices and by locked purchases. In one process on the embedded database, whose queries
 * interleave between requests as over a socket.
 */
describe('the shop: the price list', () => {
  let app: INestApplication;
  let http: ReturnType<typeof request>;
  const products: number[] = [];

  beforeAll(async () => {
    app = await createShopApp({}, false);
    await app.listen(0, '127.0.0.1');
    http = request(app.getHttpServer());
    for (let i = 0; i < 4; i++)
      products.push(
        (
          await http
            .post('/products')
            .send({ name: `priced ${i}`, stock: 60 })
            .expect(201)
        ).body.id,
      );
  }, 60_000);

  afterAll(async () => {
    await app?.close();
  });

  const priceMap = (list: PriceList) => new Map(list.prices.map((price) => [price.productId, price.cents]));

  it('readers never see half a rebuild, and purchases pay a price of a published list', async () => {
    const first = (await http.post('/prices/rebuild').expect(200)).body as PriceList;
    const published = new Map([[first.version, priceMap(first)]]);
    expect(first.prices.every((price) => price.version === first.version)).toBe(true);

    // Rebuilds one after another; meanwhile, waves of readers and of buyers until they are done.
    let rebuilding = true;
    const rebuilds = (async () => {
      for (let i = 0; i < 6; i++) {
        const list = (await http.post('/prices/rebuild').expect(200)).body as PriceList;
        published.set(list.version, priceMap(list));
      }
      rebuilding = false;
    })();
    const waves = async <T>(wave: () => Promise<T>[]): Promise<T[]> => {
      const answers: T[] = [];
      for (let i = 0; i < 40 && rebuilding; i++) answers.push(...(await Promise.all(wave())));
      return answers;
    };
    const lists = waves(() => Array.from({ length: 3 }, () => http.get('/prices').expect(200)));
    // Each sale lowers its product's stock, so the next rebuild prices it a little higher. Product 1
    // (in stock from the shop's first start) is the first a rebuild reprices: the longest a torn
    // read of it could go unnoticed.
    const bought = [1, ...products];
    const purchases = waves(() => bought.map((id) => http.post(`/products/${id}/purchase`).expect(201)));
    await rebuilds;

    expect([...published.keys()].sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6].map((n) => n + first.version));
    for (const { body } of await lists) {
      const list = body as PriceList;
      expect(list.prices.filter((price) => price.version !== list.version)).toEqual([]);
      expect(priceMap(list)).toEqual(published.get(list.version));
    }
    expect((await purchases).length).toBeGreaterThan(0);
    for (const { body } of await purchases) {
      expect(body.price).toEqual({ cents: published.get(body.price.version)?.get(body.productId), version: body.price.version });
    }
    // The prices did change between rebuilds: a purchase paired with the wrong version would show.
    expect(new Set([...published.values()].map((prices) => prices.get(products[0]))).size).toBeGreaterThan(1);
  });

  it('refuses the writes of a rebuild that lost its lock once a newer one has written', async () => {
    const locks = app.get(LockService);
    const repository = app.get(PriceListRepository);
    // The token a rebuild paused past its lease would still carry: older than the next rebuild's.
    const stale = await locks.acquire('price-list');
    await stale.release();
    const newer = (await http.post('/prices/rebuild').expect(200)).body as PriceList;

    expect(await repository.writePrice(products[0], 1, newer.version + 1, stale.fencingToken)).toBe(false);
    expect(await repository.publish(newer.version + 1, stale.fencingToken)).toBe(false);
    expect((await http.get('/prices').expect(200)).body).toEqual(newer);
  });
});
