import { Inject, Injectable } from '@nestjs/common';
import { DATABASE, type Database } from './database.provider.js';

/** A product's price in one version of the price list. */
export interface Price {
  productId: number;
  name: string;
  cents: number;
  /** The version of the list this price belongs to: the rebuild that wrote it. */
  version: number;
}

interface PriceRow {
  product_id: number;
  name: string;
  cents: number;
  version: number;
}

const toPrice = (row: PriceRow): Price => ({ productId: row.product_id, name: row.name, cents: row.cents, version: row.version });

/** The SQL of the price list. Its writes carry the rebuild's fencing token (when the lock backend has tokens). */
@Injectable()
export class PriceListRepository {
  constructor(@Inject(DATABASE) private readonly db: Database) {}

  /** The version readers see: the newest finished rebuild. */
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

  /**
   * What a product costs in the published list, in one statement (a purchase pays for it in time).
   * One statement sees one snapshot, but the rebuild commits product by product: only the lock
   * keeps the row and the version from two different rebuilds.
   */
  async quote(productId: number): Promise<{ cents: number; version: number } | undefined> {
    const { rows } = await this.db.query<{ cents: number; version: number }>(
      'SELECT cents, (SELECT max(version) FROM price_list_versions) AS version FROM price_list WHERE product_id = $1',
      [productId],
    );
    return rows[0];
  }

  /** What a rebuild prices each product from. */
  async pricingInputs(): Promise<{ id: number; baseCents: number; stock: number }[]> {
    const { rows } = await this.db.query<{ id: number; base_cents: number; stock: number }>(
      'SELECT id, base_cents, stock FROM products ORDER BY id',
    );
    return rows.map((row) => ({ id: row.id, baseCents: row.base_cents, stock: row.stock }));
  }

  /**
   * Writes one product's price; false when a rebuild with a newer token has written it since.
   * `token` undefined: a lock backend without tokens (Redlock), the write is not fenced.
   */
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

  /** Makes `version` the list readers see; false when a rebuild with a newer token has published since. */
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
