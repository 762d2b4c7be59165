import { BadRequestException, Injectable, type CanActivate, type ExecutionContext } from '@nestjs/common';

/**
 * Every request body the shop takes is a JSON object. The JSON parser also accepts arrays, and
 * a field read from an array (`@Body('quantity')` of `[1]`) is undefined, which the pipes take as
 * "not given, use the default": `[1]` would buy one item. So any other body is refused here, for
 * every route at once, before any pipe reads a field. No body at all is fine (all defaults).
 */
@Injectable()
export class JsonObjectBodyGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    if (context.getType() !== 'http') return true;
    const { body } = context.switchToHttp().getRequest<{ body?: unknown }>();
    if (body === undefined || (typeof body === 'object' && body !== null && !Array.isArray(body))) return true;
    throw new BadRequestException({
      statusCode: 400,
      error: 'Bad Request',
      message: `The request body must be a JSON object, such as {"quantity": 1}; got ${describe(body)}.`,
    });
  }
}

function describe(body: unknown): string {
  if (Array.isArray(body)) return 'an array';
  if (body === null) return 'null';
  return `a ${typeof body}`;
}
