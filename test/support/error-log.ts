import type { LoggerService } from '@nestjs/common';

/** A Nest logger that keeps what the app logs as errors, for tests that expect none. */
export class ErrorLog implements LoggerService {
  readonly errors: unknown[] = [];
  log(): void {}
  warn(): void {}
  error(...message: unknown[]): void {
    this.errors.push(message);
  }
}
