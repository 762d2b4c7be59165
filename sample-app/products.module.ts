import { Module } from '@nestjs/common';
import { PriceListController } from './price-list.controller.js';
import { PriceListRepository } from './price-list.repository.js';
import { PriceListService } from './price-list.service.js';
import { ProductsController } from './products.controller.js';
import { ProductsRepository } from './products.repository.js';
import { ProductsService } from './products.service.js';

@Module({
  controllers: [ProductsController, PriceListController],
  providers: [ProductsService, ProductsRepository, PriceListService, PriceListRepository],
  exports: [ProductsService],
})
export class ProductsModule {}
