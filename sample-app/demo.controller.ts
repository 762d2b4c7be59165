import { Body, ConflictException, Controller, Get, Header, Post, Res } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { ServerResponse } from 'node:http';
import { runDemo } from './demo.runner.js';
import { IntRangePipe } from './int-range.pipe.js';
import { SHOP_PAGE } from './shop.page.js';

/** The page at / and the demo it runs: this instance sends the buyers to itself, over HTTP. */
@Controller()
export class DemoController {
  private running = false;

  constructor(private readonly adapterHost: HttpAdapterHost) {}

  @Get()
  @Header('Content-Type', 'text/html; charset=utf-8')
  page(): string {
    return SHOP_PAGE;
  }

  /**
   * Streams the run as newline-delimited JSON, one DemoEvent per line, so the page can show
   * each endpoint's progress as it happens (fetch + a stream reader; EventSource is GET-only).
   */
  @Post('demo')
  async run(
    @Body('buyers', new IntRangePipe('buyers', 1, 2_000, 500)) buyers: number,
    @Body('stock', new IntRangePipe('stock', 1, 10_000, 100)) stock: number,
    @Res() reply: ServerResponse | { raw: ServerResponse },
  ): Promise<void> {
    if (this.running)
      throw new ConflictException({
        statusCode: 409,
        error: 'Conflict',
        code: 'DEMO_RUNNING',
        message: 'A demo is already running on this instance.',
      });
    this.running = true;
    // Express hands us the ServerResponse itself, Fastify a reply that wraps it.
    const res = 'raw' in reply ? reply.raw : reply;
    res.writeHead(200, { 'content-type': 'application/x-ndjson; charset=utf-8', 'cache-control': 'no-store' });
    const send = (event: unknown) => {
      if (!res.writableEnded) res.write(JSON.stringify(event) + '\n');
    };
    try {
      const { port } = this.adapterHost.httpAdapter.getHttpServer().address() as { port: number };
      await runDemo({ baseUrls: [`http://127.0.0.1:${port}`], buyers, stock, onEvent: send });
    } catch (error) {
      send({ type: 'error', message: (error as Error).message });
    } finally {
      this.running = false;
      res.end();
    }
  }
}
