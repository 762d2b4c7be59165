import { Injectable, type CanActivate, type ExecutionContext } from '@nestjs/common';

/**
 * The lock board's guard in the demo: requests from this machine only. A real app puts the board
 * behind its own operators' authentication instead (docs/inspection.md, "The guard").
 */
@Injectable()
export class LoopbackOnlyGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const { ip } = context.switchToHttp().getRequest<{ ip?: string }>();
    return ip === '127.0.0.1' || ip === '::1' || ip === '::ffff:127.0.0.1';
  }
}
