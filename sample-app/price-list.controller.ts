import { Controller, Get, HttpCode, Post } from '@nestjs/common';
import { PriceListService } from './price-list.service.js';

@Controller('prices')
export class PriceListController {
  constructor(private readonly priceList: PriceListService) {}

  @Get()
  current() {
    return this.priceList.current();
  }

  @Post('rebuild')
  @HttpCode(200)
  rebuild() {
    return this.priceList.rebuild();
  }
}
