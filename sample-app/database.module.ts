import { Module, type DynamicModule } from '@nestjs/common';
import { DATABASE, databaseProvider } from './database.provider.js';
import type { ShopConfig } from './shop.config.js';

@Module({})
export class DatabaseModule {
  static forRoot(config: ShopConfig): DynamicModule {
    return { module: DatabaseModule, global: true, providers: [databaseProvider(config)], exports: [DATABASE] };
  }
}
