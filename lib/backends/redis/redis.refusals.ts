import { ACL_RULE_DOCS, isAclDenial } from './redis.acl.js';

/** Why a Redis server refuses this client for good: waiting does not change its answer. */
export type RedisRefusal = 'credentials' | 'rights' | 'read-only' | 'database';

/**
 * What kind of refusal `error` is, if it is one waiting cannot heal: credentials refused
 * (WRONGPASS, NOAUTH, ioredis's "Ready check failed: NOAUTH ..."), a command the user's ACL
 * refuses (NOPERM and its script wordings), a replica refusing writes (READONLY), or a database
 * the server does not have. `readOnlyHeals`: behind Sentinel or Cluster, or from a standalone
 * server that was a master before (a failover behind one name), a READONLY answer heals: see
 * RedisConnection.readOnlyForGood.
 */
export function refusalOf(error: unknown, readOnlyHeals = false): RedisRefusal | undefined {
  const message = error instanceof Error ? error.message : String(error);
  if (/\bWRONGPASS\b|\bNOAUTH\b|invalid password|invalid username-password/i.test(message)) return 'credentials';
  if (isAclDenial(error)) return 'rights';
  if (/\bDB index is out of range\b|\binvalid DB index\b/i.test(message)) return 'database';
  if (!readOnlyHeals && /\bREADONLY\b/.test(message)) return 'read-only';
  return undefined;
}

/** What to do about a refusal, as a sentence for an error message. */
export function refusalFix(refusal: RedisRefusal, where: string): string {
  switch (refusal) {
    case 'credentials':
      return (
        `${where} refused the credentials (or asked for some and got none): check the user name and password in the URL ` +
        `('redis://user:password@host:6379') or the client's options, and that the user exists and is enabled ('ACL LIST').`
      );
    case 'rights':
      return `${where} refused a command to this user by its ACL: ${ACL_RULE_DOCS}.`;
    case 'read-only':
      return (
        `${where} is a read-only replica, which refuses the locks' writes: point the backend at the master ` +
        `(or use Sentinel, which follows failovers).`
      );
    case 'database':
      return `${where} has no such database: name one from 0 to its 'databases' setting minus 1 (16 by default).`;
  }
}
