import { BadRequestException, Injectable, type PipeTransform } from '@nestjs/common';

/**
 * A whole number in [min, max], from a route parameter ("7") or a JSON body field (7). Stricter
 * than ParseIntPipe, which lets "-3" and 1e300 through; `fallback` is used when the value is absent.
 */
@Injectable()
export class IntRangePipe implements PipeTransform<unknown, number> {
  constructor(
    private readonly name: string,
    private readonly min: number,
    private readonly max: number,
    private readonly fallback?: number,
  ) {}

  transform(value: unknown): number {
    if (value === undefined && this.fallback !== undefined) return this.fallback;
    const number = typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
    if (typeof number !== 'number' || !Number.isInteger(number) || number < this.min || number > this.max) {
      throw new BadRequestException({
        statusCode: 400,
        error: 'Bad Request',
        message: `${this.name} must be a whole number from ${this.min} to ${this.max}, got ${JSON.stringify(value) ?? 'nothing'}.`,
      });
    }
    return number;
  }
}

/** Largest PostgreSQL `integer`: ids above it cannot exist. */
export const MAX_INT = 2_147_483_647;
