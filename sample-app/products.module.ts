import { Module, type Provider } from '@nestjs/common';
import { DATABASE, type Database } from './database.provider.js';
import { MysqlPriceListRepository } from './mysql-price-list.repository.js';
import { MysqlProductsRepository } from './mysql-products.repository.js';
import { PostgresPriceListRepository } from './postgres-price-list.repository.js';
import { PostgresProductsRepository } from './postgres-products.repository.js';
import { PriceListController } from './price-list.controller.js';
import { PriceListRepository } from './price-list.repository.js';
import { PriceListService } from './price-list.service.js';
import { ProductsController } from './products.controller.js';
import { ProductsRepository } from './products.repository.js';
import { ProductsService } from './products.service.js';

/** The repositories that speak the shop's database's SQL; the services see only their abstract classes. */
const repositories: Provider[] = [
  {
    provide: ProductsRepository,
    inject: [DATABASE],
    useFactory: (db: Database) => (db.kind === 'mysql' ? new MysqlProductsRepository(db) : new PostgresProductsRepository(db)),
  },
  {
    provide: PriceListRepository,
    inject: [DATABASE],
    useFactory: (db: Database) => (db.kind === 'mysql' ? new MysqlPriceListRepository(db) : new PostgresPriceListRepository(db)),
  },
];

@Module({
  controllers: [ProductsController, PriceListController],
  providers: [ProductsService, PriceListService, ...repositories],
  exports: [ProductsService],
})
export class ProductsModule {}
