import { BadRequestException, ConflictException, NotFoundException } from '@nestjs/common';

export class ProductNotFoundException extends NotFoundException {
  constructor(readonly productId: number) {
    super({ statusCode: 404, error: 'Not Found', message: `Product ${productId} does not exist.`, productId });
  }
}

/** 409: a business answer, not a busy lock (that one has `keys` and a Retry-After header). */
export class OutOfStockException extends ConflictException {
  constructor(
    readonly productId: number,
    readonly stock: number,
    readonly requested: number,
  ) {
    super({
      statusCode: 409,
      error: 'Conflict',
      code: 'OUT_OF_STOCK',
      message: `Out of stock: product ${productId} has ${stock} left, ${requested} requested.`,
      productId,
      stock,
      requested,
    });
  }
}

/**
 * 409: this request's lock was lost before its write reached the database (the process paused
 * past its lease, say), and a newer holder has written since. Nothing was sold; retrying is safe.
 */
export class StaleFencingTokenException extends ConflictException {
  constructor(
    readonly productId: number,
    readonly fencingToken: number,
    readonly lastToken: number | undefined,
  ) {
    super({
      statusCode: 409,
      error: 'Conflict',
      code: 'STALE_FENCING_TOKEN',
      message:
        `Write to product ${productId} refused: fencing token ${fencingToken} is not newer than the last one written` +
        `${lastToken === undefined ? '' : ` (${lastToken})`}. This request lost its lock before writing; nothing was sold.`,
      productId,
      fencingToken,
      lastToken,
    });
  }
}

/** 400: a restock that would take the stock past what its column can hold. Nothing was added. */
export class StockLimitException extends BadRequestException {
  constructor(
    readonly productId: number,
    readonly stock: number,
    readonly requested: number,
    readonly limit: number,
  ) {
    super({
      statusCode: 400,
      error: 'Bad Request',
      code: 'STOCK_LIMIT',
      message:
        `Restocking product ${productId} by ${requested} would take its stock from ${stock} past ${limit}, the most it can hold; ` +
        `at most ${limit - stock} more fit.`,
      productId,
      stock,
      requested,
      limit,
    });
  }
}

/**
 * 409: a price list rebuild lost its lock before it finished (the process paused past its lease),
 * and a newer rebuild has written since. Its prices were not published; the newer list stands.
 */
export class StalePriceListException extends ConflictException {
  constructor(
    readonly version: number,
    readonly fencingToken: number | undefined,
  ) {
    super({
      statusCode: 409,
      error: 'Conflict',
      code: 'STALE_FENCING_TOKEN',
      message:
        `Price list version ${version} refused: a newer rebuild has written since this one's fencing token ${fencingToken}. ` +
        `This rebuild lost its lock before it finished; the newer price list stands.`,
      version,
      fencingToken,
    });
  }
}
