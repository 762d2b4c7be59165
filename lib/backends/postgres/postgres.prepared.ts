import { Logger } from '@nestjs/common';
import { sentence } from '../backend-message.js';

const logger = new Logger('DistributedLock');

/** "prepared statement ... does not exist", "prepared statement ... already exists". */
const REFUSED_CODES = new Set(['26000', '42P05']);

/** A statement as pg takes it: with a name, PostgreSQL parses and plans it once per connection. */
export interface QueryConfig {
  name?: string;
  text: string;
  values: unknown[];
}

/**
 * The lock operations' statements (acquire, extend, release) as named prepared statements: pg
 * parses each once per connection and then only binds and runs it, a third less work per call
 * for PostgreSQL than an unnamed statement parsed and planned every time.
 *
 * A pooler in transaction mode that does not track them (pgbouncer before 1.21, or with
 * max_prepared_statements = 0) runs the next transaction on another server connection, which
 * does not know the name ("does not exist"), or knows it from another client ("already exists").
 * Both are refused before anything runs, so the statement is sent again unnamed, and so is every
 * statement after it. The same for a connection whose statements someone deallocated (DISCARD ALL).
 */
export class PreparedStatements {
  private named = true;

  constructor(
    /** Makes the names unique per table: two backends on other tables may share a pool. */
    private readonly qualified: string,
  ) {}

  config(text: string, values: readonly unknown[], op: string | undefined): QueryConfig {
    if (op === undefined || !this.named) return { text, values: values as unknown[] };
    return { name: `ndl ${op} ${this.qualified}`, text, values: values as unknown[] };
  }

  /** Whether `error` refused a named statement: from now on, statements go unnamed. */
  refused(config: QueryConfig, error: unknown): boolean {
    if (config.name === undefined) return false;
    const code = typeof error === 'object' && error !== null ? (error as { code?: unknown }).code : undefined;
    if (typeof code !== 'string' || !REFUSED_CODES.has(code)) return false;
    if (this.named) {
      this.named = false;
      logger.warn(
        `PostgreSQL refused a named prepared statement of the lock table ${this.qualified} (${sentence(String((error as Error).message))} ` +
          `A pooler in transaction mode that does not keep them?): the lock statements are sent unnamed from now on.`,
      );
    }
    return true;
  }
}
