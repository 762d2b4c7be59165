import { Body, ConflictException, Controller, Post, Res } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { ServerResponse } from 'node:http';
import { runDemo } from './demo.runner.js';
import { IntRangePipe } from './int-range.pipe.js';

/**
 * Most buyers one POST /demo may ask for. Each buyer is two requests per endpoint (a GET that
 * opens its connection, then the purchase), so one call makes this process send itself at most
 * 3 × (2 × 500 + 2) = 3 006 requests, and only one demo runs at a time. 500 is the demo's own
 * default: enough buyers at once for the unsafe endpoint to oversell.
 */
export const DEMO_MAX_BUYERS = 500;
/** Stock per demo product: one row each, whatever the number; above the buyers nothing sells out. */
export const DEMO_MAX_STOCK = 10_000;

/** The demo the page runs: this instance sends the buyers to itself, over HTTP. Served only when switched on. */
@Controller()
export class DemoController {
  private running = false;

  constructor(private readonly adapterHost: HttpAdapterHost) {}

  /**
   * Streams the run as newline-delimited JSON, one DemoEvent per line, so the page can show
   * each endpoint's progress as it happens (fetch + a stream reader; EventSource is GET-only).
   */
  @Post('demo')
  async run(
    @Body('buyers', new IntRangePipe('buyers', 1, DEMO_MAX_BUYERS, 500)) buyers: number,
    @Body('stock', new IntRangePipe('stock', 1, DEMO_MAX_STOCK, 100)) stock: number,
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
