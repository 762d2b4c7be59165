import type mysql from 'mysql2/promise';

/**
 * The shop's schema on MySQL or MariaDB: the same tables, columns and migration ids as
 * database.migrations.ts (PostgreSQL), one statement per string. Applied in order, each once,
 * recorded in schema_migrations. Never edit one that has shipped.
 *
 * Every table is utf8mb4 with a binary collation: a name comes back exactly as it was stored
 * (emoji included, which MySQL's 3-byte `utf8` cannot hold), and where text is compared it is
 * compared byte for byte, not with the defaults' 'a' = 'A' = 'a '.
 */
export const MYSQL_MIGRATIONS: readonly { id: number; name: string; statements: readonly string[] }[] = [
  {
    id: 1,
    name: 'products and orders',
    statements: [
      `CREATE TABLE products (
        id         INT          NOT NULL AUTO_INCREMENT PRIMARY KEY,
        name       VARCHAR(200) NOT NULL,
        stock      INT          NOT NULL CHECK (stock >= 0),
        -- The newest fencing token that wrote this row; a write with an older one is refused.
        last_token BIGINT       NOT NULL DEFAULT 0
      ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`,
      `CREATE TABLE orders (
        id            INT          NOT NULL AUTO_INCREMENT PRIMARY KEY,
        product_id    INT          NOT NULL,
        quantity      INT          NOT NULL CHECK (quantity > 0),
        endpoint      VARCHAR(16)  NOT NULL,
        fencing_token BIGINT       NULL,
        created_at    TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        KEY orders_product_id (product_id),
        CONSTRAINT orders_product FOREIGN KEY (product_id) REFERENCES products (id)
      ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`,
    ],
  },
  {
    id: 2,
    name: 'a few products to look at',
    statements: [
      `INSERT INTO products (name, stock) VALUES
        ('Limited-edition vinyl', 100),
        ('Concert ticket, row A', 40),
        ('Signed poster', 10)`,
    ],
  },
  {
    id: 3,
    name: 'the price list',
    statements: [
      // What a product costs when plenty is left; the price list adds to it as stock runs low.
      `ALTER TABLE products ADD COLUMN base_cents INT NOT NULL DEFAULT 1000 CHECK (base_cents > 0)`,
      `UPDATE products SET base_cents = CASE name
        WHEN 'Limited-edition vinyl' THEN 3000 WHEN 'Concert ticket, row A' THEN 8000 WHEN 'Signed poster' THEN 2000 ELSE 1000 END`,
      // Rewritten in place by each rebuild, one product at a time; version: the rebuild that wrote the row.
      `CREATE TABLE price_list (
        product_id    INT    NOT NULL PRIMARY KEY,
        cents         INT    NOT NULL,
        version       INT    NOT NULL,
        fencing_token BIGINT NOT NULL DEFAULT 0,
        CONSTRAINT price_list_product FOREIGN KEY (product_id) REFERENCES products (id)
      ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`,
      // One row per finished rebuild: the newest is the list readers see.
      `CREATE TABLE price_list_versions (
        version       INT          NOT NULL PRIMARY KEY,
        fencing_token BIGINT       NOT NULL DEFAULT 0,
        built_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
      ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`,
      `INSERT INTO price_list_versions (version) VALUES (0)`,
      // What a locked purchase charged per item, and from which version of the list.
      `ALTER TABLE orders ADD COLUMN price_cents INT NULL, ADD COLUMN price_list_version INT NULL`,
    ],
  },
];

/**
 * Every process of the shop takes this named lock to migrate. GET_LOCK names are server-wide, so it
 * names the database too (cut to the 64 characters MySQL takes).
 */
const MIGRATION_LOCK = "LEFT(CONCAT('shop-migrations:', DATABASE()), 64)";
const MIGRATION_LOCK_WAIT_S = 60;

/**
 * Runs at start-up. Several processes may start at once against one database: the named lock makes
 * the others wait, then find the migrations applied. MySQL commits each CREATE and ALTER on its
 * own (DDL is not transactional there), so a migration that fails half-way stays half-applied and
 * unrecorded: fix it by hand, as with any MySQL migration tool.
 */
export async function runMysqlMigrations(pool: mysql.Pool): Promise<void> {
  // One connection: GET_LOCK belongs to the connection that took it.
  const connection = await pool.getConnection();
  try {
    const [[{ locked }]] = await connection.query<mysql.RowDataPacket[]>(`SELECT GET_LOCK(${MIGRATION_LOCK}, ?) AS locked`, [
      MIGRATION_LOCK_WAIT_S,
    ]);
    if (Number(locked) !== 1) {
      throw new Error(`Another process held the shop's migration lock for ${MIGRATION_LOCK_WAIT_S} s; is a migration stuck?`);
    }
    try {
      await connection.query(
        `CREATE TABLE IF NOT EXISTS schema_migrations (
          id         INT          NOT NULL PRIMARY KEY,
          name       VARCHAR(200) NOT NULL,
          applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
        ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`,
      );
      const [rows] = await connection.query<mysql.RowDataPacket[]>('SELECT id FROM schema_migrations');
      const applied = new Set(rows.map((row) => Number(row.id)));
      for (const migration of MYSQL_MIGRATIONS) {
        if (applied.has(migration.id)) continue;
        for (const statement of migration.statements) await connection.query(statement);
        await connection.query('INSERT INTO schema_migrations (id, name) VALUES (?, ?)', [migration.id, migration.name]);
      }
    } finally {
      await connection.query(`SELECT RELEASE_LOCK(${MIGRATION_LOCK})`);
    }
  } finally {
    connection.release();
  }
}
