import type { ITxnRequest } from 'etcd3';
import { LockBackendError } from '../../lock.errors.js';
import type { BackendHealth } from '../lock-backend.interface.js';
import type { EtcdConnection } from './etcd.connection.js';

/** Who the backend is to etcd and where its keys live, for messages that say what to grant. */
export interface EtcdIdentity {
  /** The user of the client the backend created from settings; unknown for a client you pass. */
  username: string | undefined;
  prefix: string;
}

/**
 * Whether etcd takes the backend's credentials and lets it read and write its prefix: one
 * transaction that etcd checks as it checks a lock's and never applies (see accessProbe).
 */
export class EtcdAccess {
  constructor(
    private readonly connection: EtcdConnection,
    private readonly prefix: string,
  ) {}

  /** Rejects with the permanent LockBackendError etcd's refusal gives; resolves when no member answers. */
  async verify(): Promise<void> {
    await this.probe('verify').catch((error: unknown) => {
      if (error instanceof LockBackendError && error.permanent) throw error;
    });
  }

  async health(): Promise<BackendHealth> {
    try {
      await this.probe('health check');
    } catch (error) {
      if (error instanceof LockBackendError && error.permanent) return { up: false, details: {}, message: error.message };
      throw error;
    }
    return { up: true, details: {} };
  }

  private async probe(op: string): Promise<void> {
    await this.connection.txn(accessProbe(this.prefix), { op, keys: [] });
  }
}

/**
 * What etcd said, when it is a refusal that waiting cannot heal (credentials, rights), as a
 * sentence naming the cause and the fix; undefined for anything else. By the message, not
 * instanceof: a client the user passed may come from another copy of etcd3.
 */
export function accessRefusal(message: string, { username, prefix }: EtcdIdentity): string | undefined {
  const user = username === undefined ? "your Etcd3 client's user" : `user '${username}'`;
  if (/authentication failed|invalid user ID or password/.test(message)) {
    return (
      `etcd refused the credentials of ${user} (authentication failed, invalid user ID or password). ` +
      `Check auth: { username, password } in the backend's etcd3 settings (etcdctl user get <name> shows the user; ` +
      `etcdctl user passwd <name> sets its password).`
    );
  }
  if (/permission denied/.test(message)) {
    return (
      `etcd refused ${user} this operation (permission denied). The backend reads and writes every key under ` +
      `'${prefix}': grant them to a role of that user, e.g. etcdctl role add locks; ` +
      `etcdctl role grant-permission locks readwrite --prefix=true '${prefix}'; etcdctl user grant-role <user> locks.`
    );
  }
  if (/user name is empty/.test(message)) {
    return `etcd has authentication enabled and this client sends no user: pass { hosts, auth: { username, password } }.`;
  }
  if (/authentication is not enabled/.test(message)) {
    return `this client sends a user, but etcd has authentication off: remove 'auth' from the settings, or enable it (etcdctl auth enable).`;
  }
  return undefined;
}

/**
 * A transaction etcd checks as it checks a lock's, and never applies: its condition (a create
 * revision below 0) never holds, yet etcd checks the rights of both branches before it looks at
 * the condition. It needs read on the whole prefix (lines are read as ranges) and write on a key
 * under it, and it goes through Raft like a lock's transaction, so it also proves a quorum. It
 * writes nothing.
 */
export function accessProbe(prefix: string): ITxnRequest {
  const probe = Buffer.from(`${prefix}%probe`);
  const start = Buffer.from(prefix);
  return {
    compare: [{ key: probe, target: 'Create', result: 'Less', create_revision: 0 }],
    success: [
      { request_range: { key: start, range_end: prefixEnd(start), count_only: true } },
      { request_put: { key: probe, value: Buffer.from('probe') } },
    ],
    failure: [],
  };
}

/** The end of the range of keys that start with `prefix`, as etcd counts a prefix. */
export function prefixEnd(prefix: Buffer): Buffer {
  const end = Buffer.from(prefix);
  for (let i = end.length - 1; i >= 0; i--) {
    if (end[i] < 0xff) {
      end[i]++;
      return end.subarray(0, i + 1);
    }
  }
  return Buffer.from([0]);
}
