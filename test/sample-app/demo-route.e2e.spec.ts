import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Server } from 'node:http';
import request from 'supertest';
import type { DemoEvent } from '../../sample-app/demo.runner.js';
import { createShopApp } from '../../sample-app/shop.app.js';
import type { ShopConfig } from '../../sample-app/shop.config.js';

/** A shop in this process (embedded PostgreSQL, in-process locks) that counts the requests it serves. */
async function startShop(config: ShopConfig) {
  const app = await createShopApp(config, false);
  await app.listen(0, '127.0.0.1');
  let served = 0;
  (app.getHttpServer() as Server).on('request', () => served++);
  return { app, http: request(app.getHttpServer()), served: () => served };
}

const productCount = async (http: ReturnType<typeof request>): Promise<number> => (await http.get('/products').expect(200)).body.length;

describe('POST /demo, which makes the shop send itself requests', () => {
  describe('by default', () => {
    let shop: Awaited<ReturnType<typeof startShop>>;

    beforeAll(async () => {
      shop = await startShop({});
    }, 60_000);

    afterAll(async () => {
      await shop?.app.close();
    });

    it('is not served: 404, and no demo runs', async () => {
      const before = await productCount(shop.http);
      const served = shop.served();
      await shop.http.post('/demo').send({ buyers: 1, stock: 1 }).expect(404);
      expect(shop.served() - served).toBe(1);
      expect(await productCount(shop.http)).toBe(before);
    });

    it('the page still lists the products, its demo button disabled, saying how to switch it on', async () => {
      const page = await shop.http
        .get('/')
        .expect(200)
        .expect('content-type', /text\/html/);
      expect(page.text).toContain('<button id="run" type="button" disabled>Run the demo</button>');
      expect(page.text).toMatch(
        /<span id="status" data-state="off">The demo is off on this shop\. Start it with <code>SHOP_DEMO=on npm run shop<\/code>/,
      );
      expect(page.text).toContain("fetch('/products')");
    });
  });

  describe('switched on (SHOP_DEMO=on)', () => {
    let shop: Awaited<ReturnType<typeof startShop>>;

    beforeAll(async () => {
      shop = await startShop({ demo: true });
    }, 60_000);

    afterAll(async () => {
      await shop?.app.close();
    });

    it('offers its button on the page, with the limits it accepts', async () => {
      const page = await shop.http.get('/').expect(200);
      expect(page.text).toContain('<button id="run" type="button">Run the demo</button>');
      expect(page.text).toContain('<input id="buyers" type="number" min="1" max="500" value="500">');
      expect(page.text).toContain('<span id="status" data-state="idle">');
    });

    it.each([
      [{ buyers: 501 }, 'buyers must be a whole number from 1 to 500, got 501.'],
      [{ buyers: 2_000 }, 'buyers must be a whole number from 1 to 500, got 2000.'],
      [{ buyers: 1e9 }, 'buyers must be a whole number from 1 to 500, got 1000000000.'],
      [{ buyers: 0 }, 'buyers must be a whole number from 1 to 500, got 0.'],
      [{ stock: 10_001 }, 'stock must be a whole number from 1 to 10000, got 10001.'],
      [[{ buyers: 500 }], 'The request body must be a JSON object, such as {"quantity": 1}; got an array.'],
    ])('refuses %j with 400 before sending a single buyer', async (body, message) => {
      const before = await productCount(shop.http);
      const served = shop.served();
      const response = await shop.http.post('/demo').send(body).expect(400);
      expect(response.body).toEqual({ statusCode: 400, error: 'Bad Request', message });
      expect(shop.served() - served).toBe(1);
      expect(await productCount(shop.http)).toBe(before);
    });

    it('at its largest (500 buyers) one call makes the shop serve 3 006 requests of its own, and no more', async () => {
      const served = shop.served();
      const response = await shop.http.post('/demo').send({ buyers: 500, stock: 100 }).expect(200);
      const events = (response.text.trim().split('\n') as string[]).map((line) => JSON.parse(line) as DemoEvent);
      const done = events.at(-1);
      expect(done?.type).toBe('done');
      expect(done?.type === 'done' && done.summary.results.locked).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });
      // The call itself, then per endpoint: create the product, 500 GETs that open the buyers'
      // connections, 500 purchases, one GET of the stock left.
      expect(shop.served() - served).toBe(1 + 3 * (1 + 500 + 500 + 1));
    }, 180_000);
  });
});
