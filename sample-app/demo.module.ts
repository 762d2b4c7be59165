import { Module, type DynamicModule } from '@nestjs/common';
import { DemoController } from './demo.controller.js';
import { DEMO_ROUTE_ON, ShopPageController } from './shop-page.controller.js';

/** The page at /, always; the demo it runs, POST /demo, only when switched on (SHOP_DEMO=on). */
@Module({})
export class DemoModule {
  static forRoot(options: { demo?: boolean }): DynamicModule {
    const demo = options.demo === true;
    return {
      module: DemoModule,
      // Off, the route is not there at all: 404, as for any path the shop does not serve.
      controllers: demo ? [ShopPageController, DemoController] : [ShopPageController],
      providers: [{ provide: DEMO_ROUTE_ON, useValue: demo }],
    };
  }
}
