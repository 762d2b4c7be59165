export interface Product {
  id: number;
  name: string;
  stock: number;
  /** The fencing token of the last locked write (0: none yet). */
  lastToken: number;
}

export type Endpoint = 'unsafe' | 'locked' | 'atomic';

/** What an order charged per item, and the version of the price list it came from. */
export interface OrderPrice {
  cents: number;
  version: number;
}

/** The most a product's stock can hold: `stock` is an `integer` (PostgreSQL) or `INT` (MySQL), see the migrations. */
export const MAX_STOCK = 2_147_483_647;

/** A products row as both databases' drivers return it (a BIGINT may come back as a string). */
export interface ProductRow {
  id: number;
  name: string;
  stock: number;
  last_token: string | number | bigint;
}

export const toProduct = (row: ProductRow): Product => ({
  id: row.id,
  name: row.name,
  stock: row.stock,
  lastToken: Number(row.last_token),
});

/**
 * Every read and write of products and orders: the shop's services see only this. Each database
 * has its implementation, with its own SQL and the same behaviour (postgres-products.repository.ts
 * for PostgreSQL and PGlite, mysql-products.repository.ts for MySQL and MariaDB); products.module.ts
 * picks the one of the shop's database. A sale and its order are written together or not at all.
 */
export abstract class ProductsRepository {
  abstract list(): Promise<Product[]>;
  abstract find(id: number): Promise<Product | undefined>;
  abstract create(name: string, stock: number): Promise<Product>;
  /** Read-modify-write, step 1: read the stock into the program. */
  abstract readStock(id: number): Promise<number | undefined>;
  /** Read-modify-write, last step: write the count the program computed, whatever happened since the read; the order's id. */
  abstract writeStock(id: number, stock: number, quantity: number, endpoint: Endpoint, price?: OrderPrice): Promise<number>;
  /**
   * Read-modify-write, last step, fenced: the write only lands if `token` is newer than the last token that
   * wrote this row. A holder that lost its lock (paused past its lease) carries an older token
   * than the holder after it, so its write is refused: undefined.
   */
  abstract writeStockFenced(id: number, stock: number, quantity: number, token: number, price?: OrderPrice): Promise<number | undefined>;
  /** No lock: the database decrements in one step, refusing to go below zero (undefined). */
  abstract decrementStock(id: number, quantity: number): Promise<{ orderId: number; stock: number } | undefined>;
  /**
   * Adds stock under the product's lock, fenced like a locked sale (`token` undefined: a backend
   * without tokens). Refused (undefined) when the sum would not fit the column, or a newer token wrote.
   */
  abstract addStockFenced(id: number, quantity: number, token: number | undefined): Promise<Product | undefined>;
  abstract orderCount(id: number): Promise<number>;
}
