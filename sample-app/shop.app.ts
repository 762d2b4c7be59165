import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import type { INestApplication, LoggerService, LogLevel } from '@nestjs/common';
import { AppModule } from './app.module.js';
import type { ShopConfig } from './shop.config.js';

/** The shop as a Nest app, not yet listening: main.ts, the demo and the tests all start it here. */
export async function createShopApp(config: ShopConfig, logger: LoggerService | LogLevel[] | false = ['error', 'warn']): Promise<INestApplication> {
  const app = await NestFactory.create(AppModule.forRoot(config), { logger, abortOnError: false });
  app.enableShutdownHooks();
  return app;
}

/** Where a listening app can be reached from this machine. */
export function baseUrl(app: INestApplication): string {
  const address = app.getHttpServer().address() as { port: number };
  return `http://127.0.0.1:${address.port}`;
}
