/** A product's price in one version of the price list. */
export interface Price {
  productId: number;
  name: string;
  cents: number;
  /** The version of the list this price belongs to: the rebuild that wrote it. */
  version: number;
}

/** A price_list row joined with its product's name, as both databases' drivers return it. */
export interface PriceRow {
  product_id: number;
  name: string;
  cents: number;
  version: number;
}

export const toPrice = (row: PriceRow): Price => ({ productId: row.product_id, name: row.name, cents: row.cents, version: row.version });

/**
 * The price list's reads and writes. Its writes carry the rebuild's fencing token (when the lock
 * backend has tokens). One implementation per database, the same behaviour
 * (postgres-price-list.repository.ts, mysql-price-list.repository.ts); products.module.ts picks.
 */
export abstract class PriceListRepository {
  /** The version readers see: the newest finished rebuild. */
  abstract publishedVersion(): Promise<number>;
  abstract prices(): Promise<Price[]>;
  /**
   * What a product costs in the published list, in one statement (a purchase pays for it in time).
   * One statement sees one snapshot, but the rebuild commits product by product: only the lock
   * keeps the row and the version from two different rebuilds.
   */
  abstract quote(productId: number): Promise<{ cents: number; version: number } | undefined>;
  /** What a rebuild prices each product from. */
  abstract pricingInputs(): Promise<{ id: number; baseCents: number; stock: number }[]>;
  /**
   * Writes one product's price; false when a rebuild with a newer token has written it since.
   * `token` undefined: a lock backend without tokens (Redlock), the write is not fenced.
   */
  abstract writePrice(productId: number, cents: number, version: number, token: number | undefined): Promise<boolean>;
  /** Makes `version` the list readers see; false when a rebuild with a newer token has published since. */
  abstract publish(version: number, token: number | undefined): Promise<boolean>;
}
