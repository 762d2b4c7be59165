import { ConflictException, Injectable, type CallHandler, type ExecutionContext, type NestInterceptor } from '@nestjs/common';
import { catchError, from, mergeMap, throwError, type Observable } from 'rxjs';
import { LockNotAcquiredError } from './lock.errors.js';

/** The body every transport gets for a busy lock. */
export interface LockConflictBody {
  statusCode: 409;
  error: 'Conflict';
  message: string;
  keys: readonly string[];
  retryAfterMs?: number;
}

/**
 * Turns LockNotAcquiredError into the transport's "busy, retry later": HTTP 409 with Retry-After,
 * RpcException for microservices, WsException for gateways. Every other error passes untouched.
 * DistributedLockModule registers it app-wide (APP_INTERCEPTOR), so a busy lock anywhere under a
 * handler maps, whether @Locked sits on the handler, on a service it calls, or LockService is used
 * directly. Subclass and override a `for*` method to change one transport.
 */
@Injectable()
export class LockInterceptor implements NestInterceptor {
  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      catchError((error: unknown) =>
        error instanceof LockNotAcquiredError ? from(this.translate(error, context)).pipe(mergeMap((e) => throwError(() => e))) : throwError(() => error),
      ),
    );
  }

  protected async translate(error: LockNotAcquiredError, context: ExecutionContext): Promise<unknown> {
    const body: LockConflictBody = { statusCode: 409, error: 'Conflict', message: error.message, keys: error.keys, retryAfterMs: error.retryAfterMs };
    switch (context.getType<string>()) {
      case 'http':
        return this.forHttp(body, error, context);
      case 'rpc':
        return this.forRpc(body);
      case 'ws':
        return this.forWs(body);
      default:
        // GraphQL and others: Nest formats HttpException for them.
        return new ConflictException(body, { cause: error });
    }
  }

  protected forHttp(body: LockConflictBody, error: LockNotAcquiredError, context: ExecutionContext): unknown {
    const response = context.switchToHttp().getResponse<{ header?: Function; setHeader?: Function }>();
    // Seconds, rounded up, at least 1: the earliest the holder's lease can end, when known.
    const seconds = String(Math.max(1, Math.ceil((error.retryAfterMs ?? 1000) / 1000)));
    if (typeof response?.header === 'function') response.header('Retry-After', seconds); // Express and Fastify
    else response?.setHeader?.('Retry-After', seconds);
    return new ConflictException(body, { cause: error });
  }

  protected async forRpc(body: LockConflictBody): Promise<unknown> {
    // Imported on demand: @nestjs/microservices is an optional peer.
    const { RpcException } = await import('@nestjs/microservices');
    return new RpcException(body);
  }

  protected async forWs(body: LockConflictBody): Promise<unknown> {
    const { WsException } = await import('@nestjs/websockets');
    return new WsException(body);
  }
}
