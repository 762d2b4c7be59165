import type { Database } from './database.provider.js';
import { toPrice, type Price, type PriceListRepository, type PriceRow } from './price-list.repository.js';

/** MySQL's "duplicate entry" for a PRIMARY KEY or UNIQUE index. */
const ER_DUP_ENTRY = 1062;

/**
 * The price list in MySQL or MariaDB. The fenced upsert is an INSERT, then on a duplicate key an
 * UPDATE whose WHERE holds the fence: MySQL's `ON DUPLICATE KEY UPDATE` has no WHERE, and its
 * affected-rows count does not tell "updated" from "kept".
 */
export class MysqlPriceListRepository implements PriceListRepository {
  constructor(private readonly db: Database) {}

  async publishedVersion(): Promise<number> {
    const { rows } = await this.db.query<{ version: number }>('SELECT MAX(version) AS version FROM price_list_versions');
    return rows[0].version;
  }

  async prices(): Promise<Price[]> {
    const { rows } = await this.db.query<PriceRow>(
      'SELECT l.product_id, p.name, l.cents, l.version FROM price_list l JOIN products p ON p.id = l.product_id ORDER BY l.product_id',
    );
    return rows.map(toPrice);
  }

  async quote(productId: number): Promise<{ cents: number; version: number } | undefined> {
    const { rows } = await this.db.query<{ cents: number; version: number }>(
      'SELECT cents, (SELECT MAX(version) FROM price_list_versions) AS version FROM price_list WHERE product_id = ?',
      [productId],
    );
    return rows[0];
  }

  async pricingInputs(): Promise<{ id: number; baseCents: number; stock: number }[]> {
    const { rows } = await this.db.query<{ id: number; base_cents: number; stock: number }>(
      'SELECT id, base_cents, stock FROM products ORDER BY id',
    );
    return rows.map((row) => ({ id: row.id, baseCents: row.base_cents, stock: row.stock }));
  }

  /** A price row, once written, is never deleted: after a duplicate key the UPDATE finds it. */
  async writePrice(productId: number, cents: number, version: number, token: number | undefined): Promise<boolean> {
    const fencingToken = token ?? 0;
    try {
      await this.db.query('INSERT INTO price_list (product_id, cents, version, fencing_token) VALUES (?, ?, ?, ?)', [
        productId,
        cents,
        version,
        fencingToken,
      ]);
      return true;
    } catch (error) {
      if ((error as { errno?: number }).errno !== ER_DUP_ENTRY) throw error;
    }
    const { affectedRows } = await this.db.query(
      'UPDATE price_list SET cents = ?, version = ?, fencing_token = ? WHERE product_id = ? AND (? IS NULL OR fencing_token <= ?)',
      [cents, version, fencingToken, productId, token ?? null, token ?? null],
    );
    return affectedRows === 1;
  }

  async publish(version: number, token: number | undefined): Promise<boolean> {
    const { affectedRows } = await this.db.query(
      `INSERT INTO price_list_versions (version, fencing_token)
       SELECT ?, ? FROM DUAL
       WHERE NOT EXISTS (SELECT 1 FROM price_list_versions WHERE version >= ? OR fencing_token >= ?)`,
      [version, token ?? 0, version, token ?? null],
    );
    return affectedRows === 1;
  }
}
