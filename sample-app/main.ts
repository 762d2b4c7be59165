import { Logger } from '@nestjs/common';
import { baseUrl, createShopApp } from './shop.app.js';
import { configFromEnv, describeConfig } from './shop.config.js';

/**
 * One shop process. PORT (default 3000; 0 picks a free one), DATABASE_URL (postgres:// or
 * mysql://), REDIS_URL, REDLOCK_URLS, LOCK_BACKEND (postgres or mysql: the locks in DATABASE_URL),
 * LOCK_TTL_MS, SHOP_DEMO (on: serve POST /demo for the page's button). Prints `listening on <url>`
 * once it accepts requests: the demo and the tests wait for that line.
 */
try {
  const config = configFromEnv();
  const app = await createShopApp(config, ['log', 'error', 'warn']);
  await app.listen(Number(process.env.PORT ?? 3000), '127.0.0.1');
  new Logger('Shop').log(describeConfig(config));
  console.log(`listening on ${baseUrl(app)} (pid ${process.pid})`);
} catch (error) {
  // Nest has logged the details; one line for whoever started the process.
  console.error(`The shop did not start: ${(error as Error).message}`);
  process.exit(1);
}
