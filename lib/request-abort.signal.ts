import type { ExecutionContext } from '@nestjs/common';

/** The part of Node's ServerResponse (Express's response, Fastify's `reply.raw`) this needs. */
interface ClosableResponse {
  readonly writableFinished: boolean;
  readonly destroyed: boolean;
  once(event: 'close', listener: () => void): unknown;
  off(event: 'close', listener: () => void): unknown;
}

/** An abort signal for one HTTP request, and how to stop watching it once the handler is done. */
export interface RequestAbort {
  readonly signal: AbortSignal;
  stop(): void;
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
  const res = response as ClosableResponse;
  const controller = new AbortController();
  const reason = () =>
    new DOMException('The client closed the request before it was answered: the wait for its lock was abandoned.', 'AbortError');
  // The connection may be gone already (the client hung up while guards ran).
  if (res.destroyed && !res.writableFinished) {
    controller.abort(reason());
    return { signal: controller.signal, stop: () => undefined };
  }
  const onClose = () => {
    if (!res.writableFinished) controller.abort(reason());
  };
  res.once('close', onClose);
  return { signal: controller.signal, stop: () => res.off('close', onClose) };
}
