import type { Redis } from 'ioredis';
import { LockBackendError } from '../../lock.errors.js';
import type { RedisConnection } from './redis.connection.js';
import { refusalFix, refusalOf } from './redis.refusals.js';

/**
 * The Redis backend's start-up check (see LockBackend.verify): what connecting shows is wrong and
 * waiting cannot heal. A database the server does not have, credentials refused, a replica
 * (outside Sentinel, which follows failovers, and Cluster, which routes writes to masters; and
 * found again by a fresh connection, as a demoted master is found by a stale one): each
 * rejects with a permanent LockBackendError. A server that does not answer within `timeoutMs`
 * is not an error here: lock operations fail until it is back.
 */
export async function verifyRedis(connection: RedisConnection, backendName: string, timeoutMs: number): Promise<void> {
  const client = await connection.connected('verify', []);
  if (client.isCluster) return;
  const redis = client as Redis;
  const refuse = (message: string, cause?: unknown) => new LockBackendError(backendName, message, cause, { permanent: true });
  const ask = async <T>(command: () => Promise<T>): Promise<T | undefined> => {
    try {
      return await within(command(), timeoutMs);
    } catch (error) {
      if (connection.refusal) throw connection.refusal;
      const refusal = refusalOf(error, true);
      if (refusal === 'credentials' || refusal === 'database') throw refuse(refusalFix(refusal, connection.where(client)), error);
      // Unreachable, or a command the user's ACL leaves out: nothing to conclude from it.
      return undefined;
    }
  };

  if ((await ask(() => redis.ping())) === undefined) return;
  // ioredis goes on in database 0 when SELECT fails: on a client of the user's, its error went to
  // the user's listeners, so the connection's own database is asked (Redis 6.2 on).
  const wanted = redis.options.db ?? 0;
  const own = await ask(() => redis.call('CLIENT', 'INFO') as Promise<string>);
  const db = own === undefined ? undefined : /\bdb=(\d+)/.exec(own)?.[1];
  if (db !== undefined && Number(db) !== wanted) {
    const limit = await ask(() => redis.config('GET', 'databases') as Promise<string[]>);
    const has = limit?.[1] === undefined ? `its 'databases' setting is lower` : `it has ${limit[1]} (0 to ${Number(limit[1]) - 1})`;
    throw refuse(
      `${connection.where(client)} has no database ${wanted}: ${has}, and this client went on in database ${db}. ` +
        `Name a database it has (the URL's '/0' or the 'db' option), or raise 'databases' in its redis.conf.`,
    );
  }
  if (!redis.options.sentinels) {
    const info = await ask(() => redis.info('replication'));
    let role = info === undefined ? undefined : /^role:(\S+)/m.exec(info)?.[1];
    // A failover behind one name for the master leaves this connection on the demoted server:
    // a replica only if a fresh connection still finds one (see RedisConnection.readOnlyForGood).
    if (role !== undefined && role !== 'master') role = await connection.freshRole(redis, timeoutMs);
    if (role !== undefined && role !== 'master') {
      throw refuse(
        `${connection.where(client)} is a ${role === 'slave' ? 'replica' : role}: ${refusalFix('read-only', connection.where(client))}`,
      );
    }
  }
}

function within<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}
