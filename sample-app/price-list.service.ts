import { Injectable } from '@nestjs/common';
import { LockService } from 'nest-distributed-lock';
import { StalePriceListException } from './products.errors.js';
import { PriceListRepository, type Price } from './price-list.repository.js';

/** The price list as readers see it: one version, every product it prices. */
export interface PriceList {
  version: number;
  prices: Price[];
}

const PRICE_LIST_KEY = 'price-list';
/** As long as a purchase waits for its product: a rebuild in progress holds readers up that long at most. */
const PRICE_LIST_WAIT_MS = 30_000;

/**
 * The price list: rebuilt in place by one rebuild at a time, read by pages and purchases. Readers
 * hold `price-list` shared, any number at once; a rebuild holds it alone. So nobody reads a list
 * half rebuilt (some products at their new price, the version still the old one), and a stream
 * of readers does not keep a rebuild waiting: once it waits, readers that come after it wait too.
 */
@Injectable()
export class PriceListService {
  /**
   * Readers share the lock on every backend that holds shared locks; on one that does not
   * (Redlock: docs/redlock.md), they take it exclusively: one reader at a time, still never beside
   * a rebuild.
   */
  private readonly readMode: 'shared' | 'exclusive';

  constructor(
    private readonly prices: PriceListRepository,
    private readonly locks: LockService,
  ) {
    this.readMode = locks.backend.sharedHolders === true ? 'shared' : 'exclusive';
  }

  current(): Promise<PriceList> {
    return this.read(async () => ({ version: await this.prices.publishedVersion(), prices: await this.prices.prices() }));
  }

  /** What one product costs now, and from which version of the list; undefined before a rebuild priced it. */
  quote(productId: number): Promise<{ cents: number; version: number } | undefined> {
    return this.read(() => this.prices.quote(productId));
  }

  /**
   * Prices every product from its stock, the scarcer the dearer, one product at a time (a real
   * shop would ask its pricing rules or a supplier here, product by product), then publishes the
   * new version. Each write carries the rebuild's fencing token: a rebuild that lost its lock
   * (paused past its lease) and wakes up after a newer one cannot overwrite its prices.
   */
  rebuild(): Promise<PriceList> {
    return this.locks.using(
      PRICE_LIST_KEY,
      async (lock) => {
        const token = lock.fencingToken;
        const version = (await this.prices.publishedVersion()) + 1;
        for (const product of await this.prices.pricingInputs()) {
          const written = await this.prices.writePrice(product.id, priceOf(product.baseCents, product.stock), version, token);
          if (!written) throw new StalePriceListException(version, token);
        }
        if (!(await this.prices.publish(version, token))) throw new StalePriceListException(version, token);
        return { version, prices: await this.prices.prices() };
      },
      { wait: PRICE_LIST_WAIT_MS },
    );
  }

  private read<T>(fn: () => Promise<T>): Promise<T> {
    return this.locks.using(PRICE_LIST_KEY, fn, { mode: this.readMode, wait: PRICE_LIST_WAIT_MS });
  }
}

/** The base price while 100 or more are left, up to half as much again as the last ones go. */
export function priceOf(baseCents: number, stock: number): number {
  return Math.round(baseCents * (1 + Math.max(0, 100 - stock) / 200));
}
