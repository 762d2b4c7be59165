import { Controller, Get, Header, Inject } from '@nestjs/common';
import { shopPage } from './shop.page.js';

/** Injection token: whether POST /demo is served, so the page offers its button or says how to switch it on. */
export const DEMO_ROUTE_ON = Symbol('DemoRouteOn');

@Controller()
export class ShopPageController {
  private readonly page: string;

  constructor(@Inject(DEMO_ROUTE_ON) demo: boolean) {
    this.page = shopPage({ demo });
  }

  @Get()
  @Header('Content-Type', 'text/html; charset=utf-8')
  show(): string {
    return this.page;
  }
}
