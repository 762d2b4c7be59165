import 'reflect-metadata';
import { Injectable, Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DistributedLockModule, Locked, type DistributedLockModuleOptions } from '../lib/index.js';

/** The same method plain and under @Locked: the difference is the decorator's cost per call. */
@Injectable()
export class Orders {
  async plain(id: number): Promise<number> {
    return id;
  }

  @Locked('order:<id>')
  async locked(id: number): Promise<number> {
    return id;
  }
}

/** A Nest application context with Orders on the given lock options, as an app would build it. */
export async function ordersApp(options: DistributedLockModuleOptions = {}): Promise<INestApplicationContext> {
  @Module({ imports: [DistributedLockModule.forRoot(options)], providers: [Orders] })
  class OrdersBenchModule {}
  return NestFactory.createApplicationContext(OrdersBenchModule, { logger: false });
}
