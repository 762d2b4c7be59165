import type { ExecutionContext } from '@nestjs/common';

/** The part of Node's ServerResponse (Express's response, Fastify's `reply.raw`) this needs. */
interface ClosableResponse {
  readonly writableFinished: boolean;
  readonly destroyed: boolean;
  once(event: 'close', listener: () => void): unknown;
  off(event: 'close', listener: () => void): unknown;
}

/**
 * An abort signal for one HTTP request, and how to stop watching it once the handler is done.
 * Nothing is created until a wait for a lock reads `signal`: most requests take no lock, and an
 * AbortController with a 'close' listener for each of them was most of the interceptor's cost.
 */
export class RequestAbort {
  private controller: AbortController | undefined;
  private onClose: (() => void) | undefined;
  private stopped = false;

  constructor(private readonly response: ClosableResponse) {}

  /** Aborts when the client goes away before the answer is sent. */
  get signal(): AbortSignal {
    if (this.controller) return this.controller.signal;
    const controller = (this.controller = new AbortController());
    const res = this.response;
    // The connection may be gone already (the client hung up while guards or the handler ran).
    if (res.destroyed && !res.writableFinished) controller.abort(closedReason());
    else if (!this.stopped) {
      this.onClose = () => {
        if (!res.writableFinished) controller.abort(closedReason());
      };
      res.once('close', this.onClose);
    }
    return controller.signal;
  }

  /** Whether a wait read the signal and it aborted; `error` is then its reason. */
  abortedWith(error: unknown): boolean {
    return this.controller?.signal.aborted === true && error === this.controller.signal.reason;
  }

  stop(): void {
    this.stopped = true;
    if (this.onClose) this.response.off('close', this.onClose);
    this.onClose = undefined;
  }
}

function closedReason(): DOMException {
  return new DOMException('The client closed the request before it was answered: the wait for its lock was abandoned.', 'AbortError');
}

/**
 * A signal that aborts when the client of an HTTP request goes away before its answer is sent
 * (Express and Fastify): the response closes unfinished. Node's request has no signal of its own,
 * and its 'close' event is no use: it fires once the body has been read, while the client still
 * waits. Undefined for other transports (microservices and gateways have no request to close).
 */
export function requestAbortSignal(context: ExecutionContext): RequestAbort | undefined {
  if (context.getType<string>() !== 'http') return undefined;
  const reply = context.switchToHttp().getResponse<{ raw?: unknown } | undefined>();
  const response = (reply?.raw ?? reply) as Partial<ClosableResponse> | undefined;
  if (typeof response?.once !== 'function' || typeof response.off !== 'function') return undefined;
  return new RequestAbort(response as ClosableResponse);
}
