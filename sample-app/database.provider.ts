import type { Provider } from '@nestjs/common';
import { openMysqlDatabase } from './mysql.database.js';
import { openPostgresDatabase } from './postgres.database.js';
import { databaseKind, type DatabaseKind, type ShopConfig } from './shop.config.js';

export interface QueryResult<Row> {
  rows: Row[];
  /** Rows an INSERT, UPDATE or DELETE wrote (MySQL: matched, whether or not a value changed). */
  affectedRows: number;
  /** MySQL: the AUTO_INCREMENT id an INSERT generated (PostgreSQL returns ids with RETURNING). */
  insertId?: number;
}

/** What the shop needs from a database: parameterised queries, scripts, transactions. */
export interface Queryable {
  query<Row = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<QueryResult<Row>>;
  /** A script without parameters (migrations): several statements on PostgreSQL, one per call on MySQL. */
  exec(sql: string): Promise<void>;
}

/**
 * One of the shop's databases. The SQL is the caller's, in the dialect of `kind`: `$1` placeholders
 * for PGlite and PostgreSQL, `?` for MySQL (see products.repository.ts for who writes which).
 */
export interface Database extends Queryable {
  readonly kind: DatabaseKind;
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

/** Injection token for the shop's Database. */
export const DATABASE = Symbol('Database');

/** The database DATABASE_URL names (none: the embedded PGlite), migrated. */
export function openDatabase(config: ShopConfig): Promise<Database> {
  return databaseKind(config) === 'mysql' ? openMysqlDatabase(config.databaseUrl!) : openPostgresDatabase(config.databaseUrl);
}

export function databaseProvider(config: ShopConfig): Provider {
  return { provide: DATABASE, useFactory: () => openDatabase(config) };
}
