import type { Database } from './database.provider.js';

/** Applied in order, each once, recorded in schema_migrations. Never edit one that has shipped. */
export const MIGRATIONS: readonly { id: number; name: string; sql: string }[] = [
  {
    id: 1,
    name: 'products and orders',
    sql: `
      CREATE TABLE products (
        id         serial  PRIMARY KEY,
        name       text    NOT NULL,
        stock      integer NOT NULL CHECK (stock >= 0),
        -- The newest fencing token that wrote this row; a write with an older one is refused.
        last_token bigint  NOT NULL DEFAULT 0
      );
      CREATE TABLE orders (
        id             serial      PRIMARY KEY,
        product_id     integer     NOT NULL REFERENCES products (id),
        quantity       integer     NOT NULL CHECK (quantity > 0),
        endpoint       text        NOT NULL,
        fencing_token  bigint,
        created_at     timestamptz NOT NULL DEFAULT now()
      );
      CREATE INDEX orders_product_id ON orders (product_id);
    `,
  },
  {
    id: 2,
    name: 'a few products to look at',
    sql: `
      INSERT INTO products (name, stock) VALUES
        ('Limited-edition vinyl', 100),
        ('Concert ticket, row A', 40),
        ('Signed poster', 10);
    `,
  },
  {
    id: 3,
    name: 'the price list',
    sql: `
      -- What a product costs when plenty is left; the price list adds to it as stock runs low.
      ALTER TABLE products ADD COLUMN base_cents integer NOT NULL DEFAULT 1000 CHECK (base_cents > 0);
      UPDATE products SET base_cents = CASE name
        WHEN 'Limited-edition vinyl' THEN 3000 WHEN 'Concert ticket, row A' THEN 8000 WHEN 'Signed poster' THEN 2000 ELSE 1000 END;
      -- Rewritten in place by each rebuild, one product at a time; version: the rebuild that wrote the row.
      CREATE TABLE price_list (
        product_id    integer PRIMARY KEY REFERENCES products (id),
        cents         integer NOT NULL,
        version       integer NOT NULL,
        fencing_token bigint  NOT NULL DEFAULT 0
      );
      -- One row per finished rebuild: the newest is the list readers see.
      CREATE TABLE price_list_versions (
        version       integer     PRIMARY KEY,
        fencing_token bigint      NOT NULL DEFAULT 0,
        built_at      timestamptz NOT NULL DEFAULT now()
      );
      INSERT INTO price_list_versions (version) VALUES (0);
      -- What a locked purchase charged per item, and from which version of the list.
      ALTER TABLE orders ADD COLUMN price_cents integer, ADD COLUMN price_list_version integer;
    `,
  },
];

/** Arbitrary, fixed: every process of the shop takes this advisory lock to migrate. */
const MIGRATION_LOCK = 7_151_001;

/**
 * Runs at start-up. Several processes may start at once against one PostgreSQL: the advisory
 * lock makes the others wait, then find the migrations applied.
 */
export async function runMigrations(db: Database): Promise<void> {
  await db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK]);
    await tx.exec(
      'CREATE TABLE IF NOT EXISTS schema_migrations (id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())',
    );
    const { rows } = await tx.query<{ id: number }>('SELECT id FROM schema_migrations');
    const applied = new Set(rows.map((row) => row.id));
    for (const migration of MIGRATIONS) {
      if (applied.has(migration.id)) continue;
      await tx.exec(migration.sql);
      await tx.query('INSERT INTO schema_migrations (id, name) VALUES ($1, $2)', [migration.id, migration.name]);
    }
  });
}
