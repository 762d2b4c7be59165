import { Module, type DynamicModule } from '@nestjs/common';
import { APP_GUARD } from '@nestjs/core';
import { DistributedLockModule, LockBoardModule } from 'nest-distributed-lock';
import { DatabaseModule } from './database.module.js';
import { DemoModule } from './demo.module.js';
import { JsonObjectBodyGuard } from './json-object-body.guard.js';
import { lockModuleOptions } from './lock-backend.factory.js';
import { LoopbackOnlyGuard } from './loopback-only.guard.js';
import { ProductsModule } from './products.module.js';
import type { ShopConfig } from './shop.config.js';

@Module({})
export class AppModule {
  static forRoot(config: ShopConfig): DynamicModule {
    return {
      module: AppModule,
      imports: [
        DatabaseModule.forRoot(config),
        DistributedLockModule.forRootAsync({ isGlobal: true, useFactory: () => lockModuleOptions(config) }),
        // The locks held now, live, at /locks (the page links to it).
        LockBoardModule.forRoot({ guard: LoopbackOnlyGuard }),
        ProductsModule,
        DemoModule.forRoot({ demo: config.demo }),
      ],
      providers: [{ provide: APP_GUARD, useClass: JsonObjectBodyGuard }],
    };
  }
}
