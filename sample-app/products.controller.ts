import { Body, Controller, Get, HttpCode, Param, Post } from '@nestjs/common';
import { IntRangePipe, MAX_INT } from './int-range.pipe.js';
import { ProductNamePipe } from './product-name.pipe.js';
import { ProductsService } from './products.service.js';

const ProductId = new IntRangePipe('Product id', 1, MAX_INT);
const Quantity = new IntRangePipe('quantity', 1, 1_000, 1);
const Stock = new IntRangePipe('stock', 0, 1_000_000);
const RestockQuantity = new IntRangePipe('quantity', 1, 1_000_000);

/**
 * @Locked sits on the service, around the code that needs it, not on these handlers; a busy lock
 * still answers 409 + Retry-After, through the interceptor DistributedLockModule registers app-wide.
 */
@Controller('products')
export class ProductsController {
  constructor(private readonly products: ProductsService) {}

  @Get()
  list() {
    return this.products.list();
  }

  @Post()
  create(@Body('name', ProductNamePipe) name: string, @Body('stock', Stock) stock: number) {
    return this.products.create(name, stock);
  }

  @Get(':id')
  get(@Param('id', ProductId) id: number) {
    return this.products.get(id);
  }

  @Post(':id/purchase/unsafe')
  purchaseUnsafe(@Param('id', ProductId) id: number, @Body('quantity', Quantity) quantity: number) {
    return this.products.purchaseUnsafe(id, quantity);
  }

  @Post(':id/purchase')
  purchase(@Param('id', ProductId) id: number, @Body('quantity', Quantity) quantity: number) {
    return this.products.purchase(id, quantity);
  }

  @Post(':id/purchase/atomic')
  purchaseAtomic(@Param('id', ProductId) id: number, @Body('quantity', Quantity) quantity: number) {
    return this.products.purchaseAtomic(id, quantity);
  }

  @Post(':id/restock')
  @HttpCode(200)
  restock(@Param('id', ProductId) id: number, @Body('quantity', RestockQuantity) quantity: number) {
    return this.products.restock(id, quantity);
  }
}
