import type { Database } from './database.provider.js';
import { toPrice, type Price, type PriceListRepository, type PriceRow } from './price-list.repository.js';

/** The price list in PostgreSQL, or the embedded PGlite (the same SQL). */
export class PostgresPriceListRepository implements PriceListRepository {
  constructor(private readonly db: Database) {}

  async publishedVersion(): Promise<number> {
    const { rows } = await this.db.query<{ version: number }>('SELECT max(version) AS version FROM price_list_versions');
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
      'SELECT cents, (SELECT max(version) FROM price_list_versions) AS version FROM price_list WHERE product_id = $1',
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

  async writePrice(productId: number, cents: number, version: number, token: number | undefined): Promise<boolean> {
    const { rows } = await this.db.query(
      `INSERT INTO price_list (product_id, cents, version, fencing_token) VALUES ($1, $2, $3, COALESCE($4::bigint, 0))
       ON CONFLICT (product_id) DO UPDATE SET cents = $2, version = $3, fencing_token = COALESCE($4::bigint, 0)
       WHERE $4::bigint IS NULL OR price_list.fencing_token <= $4::bigint
       RETURNING product_id`,
      [productId, cents, version, token],
    );
    return rows.length === 1;
  }

  async publish(version: number, token: number | undefined): Promise<boolean> {
    const { rows } = await this.db.query(
      `INSERT INTO price_list_versions (version, fencing_token)
       SELECT $1::integer, COALESCE($2::bigint, 0)
       WHERE NOT EXISTS (SELECT 1 FROM price_list_versions WHERE version >= $1::integer OR fencing_token >= $2::bigint)
       RETURNING version`,
      [version, token],
    );
    return rows.length === 1;
  }
}
