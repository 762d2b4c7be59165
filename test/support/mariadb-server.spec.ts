import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import mysql from 'mysql2/promise';
import { MariadbServer } from './mariadb-server.js';

describe('the test harness MariaDB', () => {
  let server: MariadbServer;
  beforeAll(async () => {
    server = await MariadbServer.start();
  }, 60_000);
  afterAll(async () => {
    await server?.stop();
  });

  it('runs a fresh server on its own port, not 3306, with a new database per call for the test user', async () => {
    expect(server.port).not.toBe(3306);
    const first = await server.createDatabase();
    const second = await server.createDatabase();
    expect(first.url).not.toBe(second.url);
    const client = await mysql.createConnection(first.url);
    await client.query('CREATE TABLE t (x int)');
    const [rows] = await client.query<mysql.RowDataPacket[]>('SELECT count(*) AS n FROM t');
    expect(rows[0].n).toBe(0);
    // The test user is no administrator: the other database is not its own... but it was granted too.
    await client.end();
    const other = await mysql.createConnection(second.url);
    const [tables] = await other.query<mysql.RowDataPacket[]>(
      "SELECT count(*) AS n FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't'",
    );
    expect(tables[0].n).toBe(0);
    await other.end();
  });
});
