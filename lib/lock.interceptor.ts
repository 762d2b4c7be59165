import {
  BadRequestException,
  ConflictException,
  HttpException,
  Injectable,
  Optional,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { catchError, finalize, from, mergeMap, throwError, type Observable } from 'rxjs';
import { withLockAbortSource } from './lock-abort-scope.js';
import { LockConflictGraphQLError } from './lock-conflict.graphql-error.js';
import { InvalidLockKeyError, LockNotAcquiredError } from './lock.errors.js';
import { LockService } from './lock.service.js';
import { requestAbortSignal } from './request-abort.signal.js';

/**
 * The default wait before a retry. The holder's remaining lease is no estimate of when it
 * finishes: the watchdog keeps it near the full ttl for as long as the holder runs, so a lock
 * held 1.5 s would send clients away for 30 s. Nothing better is known, so the lease only bounds
 * it (a lock that expires sooner frees sooner) and a second caps it.
 */
export const DEFAULT_RETRY_AFTER_MS = 1_000;

/** The body every transport gets for a busy lock. */
export interface LockConflictBody {
  statusCode: 409;
  error: 'Conflict';
  message: string;
  keys: readonly string[];
  /** How long to wait before a retry: the module's `retryAfter`, or the default estimate. */
  retryAfterMs: number;
  /** For a shared lock or a semaphore (absent for an exclusive lock): the kind the request asked for. */
  mode?: 'shared' | 'permits';
  /** The semaphore's number of permits, when `mode` is 'permits'. */
  permits?: number;
}

/** The status nginx and others log for a request its client closed before the answer (no client sees it). */
const CLIENT_CLOSED_REQUEST = 499;

/**
 * Turns LockNotAcquiredError into the transport's "busy, retry later": HTTP 409 with Retry-After,
 * RpcException for microservices, WsException for gateways (and the client's ack, if it asked for
 * one), an error with `extensions.code: 'LOCK_CONFLICT'` for GraphQL; and a key error at call time (a value
 * from the request that cannot name a lock) into a 400. Every other error passes untouched.
 * On HTTP it also ends the handler's waits for locks when the client hangs up (see
 * requestAbortSignal): a request nobody waits for any more does not queue, and does not run.
 * DistributedLockModule registers it app-wide (APP_INTERCEPTOR), so a busy lock anywhere under a
 * handler maps, whether @Locked sits on the handler, on a service it calls, or LockService is used
 * directly (`interceptor: false` turns that off). Subclass and override a `for*` method to change
 * one transport, or `retryAfterMs` to change the wait it suggests.
 */
@Injectable()
export class LockInterceptor implements NestInterceptor {
  /** The module's LockService, for its `retryAfter` option; without it, the default estimate. */
  constructor(@Optional() private readonly locks?: LockService) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const abort = requestAbortSignal(context);
    // Nest binds the handler to the async context in which handle() is called. The signal is
    // created when a wait for a lock first reads it: a route without a lock pays for no signal.
    const handled = abort ? withLockAbortSource(abort, () => next.handle()) : next.handle();
    return handled.pipe(
      catchError((error: unknown) => {
        if (abort?.abortedWith(error)) return throwError(() => this.clientClosed(error));
        if (error instanceof LockNotAcquiredError) return from(this.translate(error, context)).pipe(mergeMap((e) => this.fail(e, context)));
        if (error instanceof InvalidLockKeyError) return from(this.badKey(error, context)).pipe(mergeMap((e) => this.fail(e, context)));
        return throwError(() => error);
      }),
      finalize(() => abort?.stop()),
    );
  }

  /**
   * Throws the mapped error; on a gateway whose client asked for an acknowledgement (socket.io's
   * `emitWithAck`, or `emit` with a callback), answers it with the error's body first. Nest's
   * exception filter only emits an 'exception' event, so without this the client's ack never
   * fires and `emitWithAck` hangs until its own timeout. Socket.io answers an ack once, so a
   * handler that acknowledged by hand before the lock failed keeps its answer.
   */
  private fail(mapped: unknown, context: ExecutionContext): Observable<never> {
    if (context.getType<string>() === 'ws' && typeof (mapped as { getError?: unknown })?.getError === 'function') {
      // Where Nest's @Ack() finds it: the first function among the handler's arguments.
      const ack = context.getArgs().find((arg): arg is (response: unknown) => void => typeof arg === 'function');
      ack?.((mapped as { getError(): unknown }).getError());
    }
    return throwError(() => mapped);
  }

  /** An HttpException, so that Nest logs no error: nobody is left to answer, and nothing failed. */
  protected clientClosed(reason: unknown): unknown {
    return new HttpException(
      {
        statusCode: CLIENT_CLOSED_REQUEST,
        error: 'Client Closed Request',
        message: 'The client closed the request while it waited for a lock.',
      },
      CLIENT_CLOSED_REQUEST,
      { cause: reason },
    );
  }

  protected async translate(error: LockNotAcquiredError, context: ExecutionContext): Promise<unknown> {
    const retryAfterMs = this.retryAfterMs(error, context);
    const body: LockConflictBody = { statusCode: 409, error: 'Conflict', message: error.message, keys: error.keys, retryAfterMs };
    const { mode, permits } = error;
    if (mode !== 'exclusive') Object.assign(body, { mode }, permits !== undefined && { permits });
    switch (context.getType<string>()) {
      case 'http':
        return this.forHttp(body, error, context);
      case 'rpc':
        return this.forRpc(body);
      case 'ws':
        return this.forWs(body);
      case 'graphql':
        return this.forGraphql(body, error);
      default:
        // Others: Nest formats HttpException for them.
        return new ConflictException(body, { cause: error });
    }
  }

  /**
   * A key error under a handler comes from what the request gave (templates are checked at
   * start-up): an empty, oversized or control-character value. That is the client's 400, not a
   * 500 with a stack, and the answer does not repeat the value, which may be an attempt to forge a
   * log line or a payload where an id belongs.
   */
  protected async badKey(error: InvalidLockKeyError, context: ExecutionContext): Promise<unknown> {
    const body = {
      statusCode: 400,
      error: 'Bad Request',
      message:
        'A value in the request cannot name a lock: it is missing, empty, too long, or holds characters a key may not. Check the identifiers it gives.',
    };
    switch (context.getType<string>()) {
      case 'rpc': {
        const { RpcException } = await import('@nestjs/microservices');
        return new RpcException(body);
      }
      case 'ws': {
        const { WsException } = await import('@nestjs/websockets');
        return new WsException(body);
      }
      default:
        return new BadRequestException(body, { cause: error });
    }
  }

  /** Milliseconds until a retry is worth it: the module's `retryAfter`, else the default estimate. */
  protected retryAfterMs(error: LockNotAcquiredError, context: ExecutionContext): number {
    const option = this.locks?.options.retryAfter;
    const chosen = typeof option === 'function' ? option(error, context) : option;
    if (typeof chosen === 'number' && Number.isFinite(chosen) && chosen >= 0) return chosen;
    return Math.min(error.retryAfterMs ?? DEFAULT_RETRY_AFTER_MS, DEFAULT_RETRY_AFTER_MS);
  }

  protected forHttp(body: LockConflictBody, error: LockNotAcquiredError, context: ExecutionContext): unknown {
    const response = context
      .switchToHttp()
      .getResponse<{ header?: (name: string, value: string) => unknown; setHeader?: (name: string, value: string) => unknown }>();
    // Retry-After takes whole seconds: rounded up, so a client never comes back too early.
    const seconds = String(Math.ceil(body.retryAfterMs / 1000));
    if (typeof response?.header === 'function')
      response.header('Retry-After', seconds); // Express and Fastify
    else response?.setHeader?.('Retry-After', seconds);
    return new ConflictException(body, { cause: error });
  }

  protected async forRpc(body: LockConflictBody): Promise<unknown> {
    // Imported on demand: @nestjs/microservices is an optional peer.
    const { RpcException } = await import('@nestjs/microservices');
    return new RpcException(body);
  }

  /** An error whose `extensions` carry `code: 'LOCK_CONFLICT'` and the body's fields (Apollo, Mercurius). */
  protected forGraphql(body: LockConflictBody, error: LockNotAcquiredError): unknown {
    return new LockConflictGraphQLError(body, { cause: error });
  }

  protected async forWs(body: LockConflictBody): Promise<unknown> {
    const { WsException } = await import('@nestjs/websockets');
    return new WsException(body);
  }
}
