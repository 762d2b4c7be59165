import type { Database, Queryable } from './database.provider.js';
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
 * Products and orders in MySQL or MariaDB. Neither has PostgreSQL's data-modifying CTEs; MySQL has
 * no RETURNING, and MariaDB's (10.5 on) is on INSERT and DELETE, not UPDATE. So each sale is an
 * UPDATE that says how many rows it matched, then the order's INSERT, in one transaction: a sale
 * and its order still exist together or not at all. The UPDATE decides (stock, fencing token) on
 * the newest row under its row lock, which the transaction holds to its end: whatever the
 * transaction reads of the row after it is its own write.
 */
export class MysqlProductsRepository implements ProductsRepository {
  constructor(private readonly db: Database) {}

  async list(): Promise<Product[]> {
    const { rows } = await this.db.query<ProductRow>('SELECT id, name, stock, last_token FROM products ORDER BY id DESC LIMIT 50');
    return rows.map(toProduct);
  }

  async find(id: number): Promise<Product | undefined> {
    const { rows } = await this.db.query<ProductRow>('SELECT id, name, stock, last_token FROM products WHERE id = ?', [id]);
    return rows[0] && toProduct(rows[0]);
  }

  /** The new row is what was given: strict mode (MySQL's and MariaDB's default) refuses a value rather than cut it. */
  async create(name: string, stock: number): Promise<Product> {
    const { insertId } = await this.db.query('INSERT INTO products (name, stock) VALUES (?, ?)', [name, stock]);
    return { id: insertId!, name, stock, lastToken: 0 };
  }

  async readStock(id: number): Promise<number | undefined> {
    const { rows } = await this.db.query<{ stock: number }>('SELECT stock FROM products WHERE id = ?', [id]);
    return rows[0]?.stock;
  }

  async writeStock(id: number, stock: number, quantity: number, endpoint: Endpoint, price?: OrderPrice): Promise<number> {
    return this.db.transaction(async (tx) => {
      await tx.query('UPDATE products SET stock = ? WHERE id = ?', [stock, id]);
      return insertOrder(tx, { id, quantity, endpoint, price });
    });
  }

  /** The token check is in the UPDATE's WHERE: InnoDB checks it on the newest row, after waiting for its lock. */
  async writeStockFenced(id: number, stock: number, quantity: number, token: number, price?: OrderPrice): Promise<number | undefined> {
    return this.db.transaction(async (tx) => {
      const { affectedRows } = await tx.query('UPDATE products SET stock = ?, last_token = ? WHERE id = ? AND last_token < ?', [
        stock,
        token,
        id,
        token,
      ]);
      if (affectedRows !== 1) return undefined;
      return insertOrder(tx, { id, quantity, endpoint: 'locked', token, price });
    });
  }

  /** InnoDB's row lock serialises concurrent decrements; each re-checks `stock >= ?` on the row it waited for. */
  async decrementStock(id: number, quantity: number): Promise<{ orderId: number; stock: number } | undefined> {
    return this.db.transaction(async (tx) => {
      const { affectedRows } = await tx.query('UPDATE products SET stock = stock - ? WHERE id = ? AND stock >= ?', [
        quantity,
        id,
        quantity,
      ]);
      if (affectedRows !== 1) return undefined;
      const { rows } = await tx.query<{ stock: number }>('SELECT stock FROM products WHERE id = ?', [id]);
      return { orderId: await insertOrder(tx, { id, quantity, endpoint: 'atomic' }), stock: rows[0].stock };
    });
  }

  /** The bound is tested as `stock <= max - quantity`, as on PostgreSQL: strict mode would refuse an INT past it with an error. */
  async addStockFenced(id: number, quantity: number, token: number | undefined): Promise<Product | undefined> {
    return this.db.transaction(async (tx) => {
      const { affectedRows } = await tx.query(
        token === undefined
          ? 'UPDATE products SET stock = stock + ? WHERE id = ? AND stock <= ? - ?'
          : 'UPDATE products SET stock = stock + ?, last_token = ? WHERE id = ? AND stock <= ? - ? AND last_token < ?',
        token === undefined ? [quantity, id, MAX_STOCK, quantity] : [quantity, token, id, MAX_STOCK, quantity, token],
      );
      if (affectedRows !== 1) return undefined;
      const { rows } = await tx.query<ProductRow>('SELECT id, name, stock, last_token FROM products WHERE id = ?', [id]);
      return toProduct(rows[0]);
    });
  }

  async orderCount(id: number): Promise<number> {
    const { rows } = await this.db.query<{ n: number }>('SELECT COUNT(*) AS n FROM orders WHERE product_id = ?', [id]);
    return Number(rows[0].n);
  }
}

/** The order of a sale whose UPDATE matched, in the same transaction; its id. */
async function insertOrder(
  tx: Queryable,
  order: { id: number; quantity: number; endpoint: Endpoint; token?: number; price?: OrderPrice },
): Promise<number> {
  const { insertId } = await tx.query(
    'INSERT INTO orders (product_id, quantity, endpoint, fencing_token, price_cents, price_list_version) VALUES (?, ?, ?, ?, ?, ?)',
    [order.id, order.quantity, order.endpoint, order.token ?? null, order.price?.cents ?? null, order.price?.version ?? null],
  );
  return insertId!;
}
