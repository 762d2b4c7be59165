import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { PostgresServer } from './postgres-server.js';

describe('the test harness PostgreSQL', () => {
  let server: PostgresServer;
  beforeAll(async () => {
    server = await PostgresServer.start();
  }, 60_000);
  afterAll(async () => {
    await server?.stop();
  });

  it('runs a fresh cluster on its own port, not 5432, with a new database per call', async () => {
    expect(server.port).not.toBe(5432);
    const first = await server.createDatabase();
    const second = await server.createDatabase();
    expect(first).not.toBe(second);
    const client = new pg.Client({ connectionString: first });
    await client.connect();
    await client.query('CREATE TABLE t (x int)');
    expect((await client.query('SELECT count(*)::int AS n FROM t')).rows[0].n).toBe(0);
    await client.end();
    const other = new pg.Client({ connectionString: second });
    await other.connect();
    const tables = await other.query("SELECT count(*)::int AS n FROM pg_tables WHERE tablename = 't'");
    expect(tables.rows[0].n).toBe(0);
    await other.end();
  });
});
