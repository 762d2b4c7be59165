import { Module, type DynamicModule } from '@nestjs/common';
import { lockBoardControllers } from './lock-board.controller.js';
import { LOCK_BOARD_OPTIONS, resolveLockBoardOptions, type LockBoardOptions } from './lock-board.options.js';
import { LockBoardService } from './lock-board.service.js';

/**
 * A page that shows the locks held now, who holds them and who waits, live: import
 * `LockBoardModule.forRoot({ guard: AdminGuard })` next to DistributedLockModule and open `/locks`.
 * Nothing is served unless it is imported; read-only unless `forceRelease` is on
 * (docs/inspection.md).
 */
@Module({})
export class LockBoardModule {
  static forRoot(options?: LockBoardOptions): DynamicModule {
    const resolved = resolveLockBoardOptions(options);
    return {
      module: LockBoardModule,
      imports: resolved.imports,
      controllers: lockBoardControllers(resolved),
      providers: [{ provide: LOCK_BOARD_OPTIONS, useValue: resolved }, LockBoardService],
    };
  }
}
