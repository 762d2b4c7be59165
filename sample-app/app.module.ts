import { Module, type DynamicModule } from '@nestjs/common';
import { APP_GUARD } from '@nestjs/core';
import { DistributedLockModule } from 'nest-distributed-lock';
import { DatabaseModule } from './database.module.js';
import { DemoModule } from './demo.module.js';
import { JsonObjectBodyGuard } from './json-object-body.guard.js';
import { lockModuleOptions } from './lock-backend.factory.js';
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
        ProductsModule,
        DemoModule.forRoot({ demo: config.demo }),
      ],
      providers: [{ provide: APP_GUARD, useClass: JsonObjectBodyGuard }],
    };
  }
}
