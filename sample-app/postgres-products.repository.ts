import type { Database } from './database.provider.js';
import {
  MAX_STOCK,
  toProduct,
  type Endpoint,
  type OrderPrice,
  type Product,
  type ProductRow,
  type ProductsRepository,
} from './products.repository.js';

/**
 * Products and orders in PostgreSQL, or the embedded PGlite (the same SQL). Each write that sells
 * also records the order in the same statement (a data-modifying CTE), so a sale and its order
 * exist together or not at all.
 */
export class PostgresProductsRepository implements ProductsRepository {
  constructor(private readonly db: Database) {}

  async list(): Promise<Product[]> {
    const { rows } = await this.db.query<ProductRow>('SELECT id, name, stock, last_token FROM products ORDER BY id DESC LIMIT 50');
    return rows.map(toProduct);
  }

  async find(id: number): Promise<Product | undefined> {
    const { rows } = await this.db.query<ProductRow>('SELECT id, name, stock, last_token FROM products WHERE id = $1', [id]);
    return rows[0] && toProduct(rows[0]);
  }

  async create(name: string, stock: number): Promise<Product> {
    const { rows } = await this.db.query<ProductRow>(
      'INSERT INTO products (name, stock) VALUES ($1, $2) RETURNING id, name, stock, last_token',
      [name, stock],
    );
    return toProduct(rows[0]);
  }

  async readStock(id: number): Promise<number | undefined> {
    const { rows } = await this.db.query<{ stock: number }>('SELECT stock FROM products WHERE id = $1', [id]);
    return rows[0]?.stock;
  }

  async writeStock(id: number, stock: number, quantity: number, endpoint: Endpoint, price?: OrderPrice): Promise<number> {
    const { rows } = await this.db.query<{ id: number }>(
      `WITH sold AS (UPDATE products SET stock = $2 WHERE id = $1 RETURNING id)
       INSERT INTO orders (product_id, quantity, endpoint, price_cents, price_list_version)
       SELECT id, $3, $4, $5::integer, $6::integer FROM sold RETURNING id`,
      [id, stock, quantity, endpoint, price?.cents ?? null, price?.version ?? null],
    );
    return rows[0].id;
  }

  /** The token check is in the UPDATE's WHERE: PostgreSQL re-checks it on the newest row after waiting for its lock. */
  async writeStockFenced(id: number, stock: number, quantity: number, token: number, price?: OrderPrice): Promise<number | undefined> {
    const { rows } = await this.db.query<{ id: number }>(
      `WITH sold AS (UPDATE products SET stock = $2, last_token = $3 WHERE id = $1 AND last_token < $3 RETURNING id)
       INSERT INTO orders (product_id, quantity, endpoint, fencing_token, price_cents, price_list_version)
       SELECT id, $4, 'locked', $3, $5::integer, $6::integer FROM sold RETURNING id`,
      [id, stock, token, quantity, price?.cents ?? null, price?.version ?? null],
    );
    return rows[0]?.id;
  }

  /**
   * One statement, no lock: the database decrements, refusing to go below zero. Row locking inside PostgreSQL
   * serialises concurrent decrements and re-checks `stock >= $2` after waiting.
   */
  async decrementStock(id: number, quantity: number): Promise<{ orderId: number; stock: number } | undefined> {
    const { rows } = await this.db.query<{ id: number; stock: number }>(
      `WITH sold AS (UPDATE products SET stock = stock - $2 WHERE id = $1 AND stock >= $2 RETURNING id, stock)
       INSERT INTO orders (product_id, quantity, endpoint) SELECT id, $2, 'atomic' FROM sold RETURNING id, (SELECT stock FROM sold)`,
      [id, quantity],
    );
    return rows[0] && { orderId: rows[0].id, stock: rows[0].stock };
  }

  /**
   * Adds stock under the product's lock, fenced like a locked sale. Refused (undefined) when the sum
   * would not fit the `integer` column: `stock + $2` past it is an error in PostgreSQL, so the
   * bound is tested as `stock <= max - $2`, which cannot overflow.
   */
  async addStockFenced(id: number, quantity: number, token: number | undefined): Promise<Product | undefined> {
    const { rows } = await this.db.query<ProductRow>(
      token === undefined
        ? 'UPDATE products SET stock = stock + $2 WHERE id = $1 AND stock <= $3::integer - $2::integer RETURNING id, name, stock, last_token'
        : `UPDATE products SET stock = stock + $2, last_token = $4
           WHERE id = $1 AND stock <= $3::integer - $2::integer AND last_token < $4 RETURNING id, name, stock, last_token`,
      token === undefined ? [id, quantity, MAX_STOCK] : [id, quantity, MAX_STOCK, token],
    );
    return rows[0] && toProduct(rows[0]);
  }

  async orderCount(id: number): Promise<number> {
    const { rows } = await this.db.query<{ n: number }>('SELECT count(*)::int AS n FROM orders WHERE product_id = $1', [id]);
    return rows[0].n;
  }
}
