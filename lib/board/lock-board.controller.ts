import {
  BadRequestException,
  Body,
  Controller,
  Get,
  Header,
  Headers,
  HttpCode,
  Inject,
  Logger,
  NotFoundException,
  Post,
  Query,
  Req,
  Res,
  ServiceUnavailableException,
  Sse,
  UnsupportedMediaTypeException,
  UseGuards,
  type MessageEvent,
  type Type,
} from '@nestjs/common';
import { exhaustMap, from, map, merge, Observable, throttleTime, timer } from 'rxjs';
import { InvalidLockKeyError, InvalidLockOptionsError } from '../lock.errors.js';
import { LOCK_BOARD_CSP, LOCK_BOARD_PAGE } from './lock-board.page.js';
import type { ResolvedLockBoardOptions } from './lock-board.options.js';
import { LockBoardService, type LockBoardSnapshot, type StreamResponse } from './lock-board.service.js';

/** What the page says when the store does not answer; the error itself goes to the server's log only (it may name hosts). */
const STORE_DOWN = 'The lock store did not answer; the server log says why.';
const MAX_PREFIX_LENGTH = 1_024;
const logger = new Logger('LockBoard');

/**
 * The board's routes under `options.path`, the guards on each: the page, its JSON, its event
 * stream, and (only with `forceRelease`) the release. Classes made per forRoot call, as a Nest
 * controller's path is fixed when its class is declared.
 */
export function lockBoardControllers(options: ResolvedLockBoardOptions): Type[] {
  @Controller(options.path)
  @UseGuards(...options.guards)
  class LockBoardController {
    constructor(@Inject(LockBoardService) private readonly board: LockBoardService) {}

    @Get()
    @Header('Content-Type', 'text/html; charset=utf-8')
    @Header('Content-Security-Policy', LOCK_BOARD_CSP)
    @Header('Cache-Control', 'no-store')
    @Header('X-Content-Type-Options', 'nosniff')
    @Header('Referrer-Policy', 'no-referrer')
    page(): string {
      return LOCK_BOARD_PAGE;
    }

    /** The held keys under `prefix`, as the page draws them. */
    @Get('api/locks')
    @Header('Cache-Control', 'no-store')
    async locks(@Query('prefix') prefix: unknown): Promise<LockBoardSnapshot> {
      const checked = checkPrefix(prefix);
      try {
        return await this.board.snapshot(checked);
      } catch (error) {
        throw badInput(error) ?? storeDown(error);
      }
    }

    /** The same, pushed every `refreshMs` and soon after each lock event of this process. */
    @Sse('api/stream')
    stream(
      @Query('prefix') prefix: unknown,
      @Res({ passthrough: true }) response: StreamResponse | { raw: StreamResponse },
    ): Observable<MessageEvent> {
      const checked = checkPrefix(prefix);
      // A change seen here is read fresh; the regular refresh may share what another page just read.
      const soon = this.board.changes().pipe(throttleTime(200, undefined, { leading: false, trailing: true }));
      const ticks = merge(timer(0, options.refreshMs).pipe(map(() => true)), soon.pipe(map(() => false)));
      const snapshots = ticks.pipe(
        exhaustMap((shared) =>
          from(
            this.board.snapshot(checked, shared).then(
              (data): MessageEvent => ({ data }),
              (error: unknown): MessageEvent => {
                const bad = badInput(error);
                if (!bad) storeDown(error);
                return { data: { error: bad?.message ?? STORE_DOWN } };
              },
            ),
          ),
        ),
      );
      // Fastify's reply carries Node's response as `raw`.
      return this.board.untilShutdown(snapshots, 'raw' in response ? response.raw : response);
    }
  }

  @Controller(options.path)
  @UseGuards(...options.guards)
  class LockBoardReleaseController {
    constructor(@Inject(LockBoardService) private readonly board: LockBoardService) {}

    /**
     * Frees a key from the holder the page showed: `{ key, holder }` as JSON, `holder` the id the
     * page got (a cross-site form cannot send JSON without the browser asking the app first). Only
     * that holder goes: not one that came after it, nor the other readers of a shared key.
     */
    @Post('api/release')
    @HttpCode(200)
    async release(
      @Body() body: unknown,
      @Headers('content-type') type: string | undefined,
      @Req() request: { ip?: string },
    ): Promise<{ released: { instance?: string; site?: string; fencingToken?: number }[] }> {
      if (!type?.toLowerCase().startsWith('application/json')) {
        throw new UnsupportedMediaTypeException('Send { "key": ..., "holder": ... } as application/json.');
      }
      const { key, holder, ...rest } = (typeof body === 'object' && body !== null ? body : {}) as Record<string, unknown>;
      const unknown = Object.keys(rest)[0];
      if (typeof key !== 'string' || key === '' || typeof holder !== 'string' || holder === '' || unknown !== undefined) {
        throw new BadRequestException(
          `The body must be { "key": "<the key, without the keyPrefix>", "holder": "<the holder's id, as the board shows it>" }.`,
        );
      }
      const who = `${options.user(request) ?? 'anonymous'} (${request.ip ?? 'unknown address'})`;
      let released;
      try {
        released = await this.board.forceRelease(key, holder, who);
      } catch (error) {
        throw badInput(error) ?? storeDown(error);
      }
      if (!released) throw new NotFoundException(`'${key}' is no longer held by that holder.`);
      return { released };
    }
  }

  return options.forceRelease ? [LockBoardController, LockBoardReleaseController] : [LockBoardController];
}

function checkPrefix(prefix: unknown): string {
  if (prefix === undefined) return '';
  if (typeof prefix !== 'string' || prefix.length > MAX_PREFIX_LENGTH) {
    throw new BadRequestException(`prefix must be one string of at most ${MAX_PREFIX_LENGTH} characters.`);
  }
  return prefix;
}

/** A key or query the library refuses: its message says what is wrong, and holds nothing but the input. */
function badInput(error: unknown): BadRequestException | undefined {
  if (error instanceof InvalidLockKeyError || error instanceof InvalidLockOptionsError) return new BadRequestException(error.message);
  return undefined;
}

function storeDown(error: unknown): ServiceUnavailableException {
  logger.error(`Reading the locks failed: ${String(error)}`, error instanceof Error ? error.stack : undefined);
  return new ServiceUnavailableException(STORE_DOWN);
}
