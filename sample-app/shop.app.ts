import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import type { INestApplication, LoggerService, LogLevel } from '@nestjs/common';
import { AppModule } from './app.module.js';
import type { ShopConfig } from './shop.config.js';

/** The shop as a Nest app, not yet listening: main.ts, the demo and the tests all start it here. */
export async function createShopApp(
  config: ShopConfig,
  logger: LoggerService | LogLevel[] | false = ['error', 'warn'],
): Promise<INestApplication> {
  const app = await NestFactory.create(AppModule.forRoot(config), { logger, abortOnError: false });
  app.enableShutdownHooks();
  // Node closes a keep-alive connection after 5 s idle; a client that reuses it at that moment gets
  // "socket hang up". The demo opens every buyer's connection before the purchases, which on a busy
  // machine takes longer than that: idle connections stay open for a minute instead.
  const server = app.getHttpServer() as { keepAliveTimeout: number; headersTimeout: number };
  server.keepAliveTimeout = 60_000;
  server.headersTimeout = 61_000;
  return app;
}

/** Where a listening app can be reached from this machine. */
export function baseUrl(app: INestApplication): string {
  const address = app.getHttpServer().address() as { port: number };
  return `http://127.0.0.1:${address.port}`;
}
