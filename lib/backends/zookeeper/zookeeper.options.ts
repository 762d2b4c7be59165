import { MAX_TIMER_MS } from '../../distributed-lock.options.js';
import { InvalidLockOptionsError } from '../../lock.errors.js';

export interface ZooKeeperLockBackendOptions {
  /**
   * The node under which each key gets a line of its own (`<root>/<key>/<owner>-<sequence>`).
   * Created on first use. Default `'/nest-distributed-lock'`.
   */
  root?: string;
  /**
   * The session timeout asked of ZooKeeper, in ms; the server grants a value between 2 and 20 of
   * its ticks (4 to 40 s with the default tickTime of 2 s). A holder that dies keeps its locks
   * this long; a holder whose event loop stalls longer than this loses them. Default 10 000.
   */
  sessionTimeout?: number;
  /**
   * Longest wait for ZooKeeper to answer one lock operation before it counts as failed, in ms. The
   * service retries within its wait. Default 2 000.
   */
  commandTimeout?: number;
}

export interface ResolvedZooKeeperOptions {
  root: string;
  sessionTimeout: number;
  commandTimeout: number;
}

const where = 'ZooKeeperLockBackend';

function fail(option: string, message: string): never {
  throw new InvalidLockOptionsError(option, `${where}: ${message}`);
}

/**
 * The connection string as ZooKeeper clients take it: `host:port` pairs separated by commas,
 * optionally followed by a chroot path (`zk1:2181,zk2:2181,zk3:2181/app`).
 */
export function checkConnectionString(value: unknown): string {
  const how = "Pass a connection string like '127.0.0.1:2181' or 'zk1:2181,zk2:2181,zk3:2181'.";
  if (typeof value !== 'string' || value.trim() === '') fail('connection', `expected a connection string, got ${show(value)}. ${how}`);
  const [hosts] = value.split('/', 1);
  for (const host of hosts.split(',')) {
    const match = /^([^:\s]+)(?::(\d+))?$/.exec(host.trim());
    const port = match?.[2] === undefined ? 2181 : Number(match[2]);
    if (!match || !(port > 0 && port < 65_536)) fail('connection', `'${host}' in the connection string is not host:port. ${how}`);
  }
  return value;
}

export function resolveOptions(options: unknown): ResolvedZooKeeperOptions {
  const resolved: ResolvedZooKeeperOptions = { root: '/nest-distributed-lock', sessionTimeout: 10_000, commandTimeout: 2_000 };
  if (options === undefined) return resolved;
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    fail('(options)', `options must be an object like { root: '/locks', sessionTimeout: 10000 }, got ${show(options)}.`);
  }
  for (const [name, value] of Object.entries(options)) {
    if (!(name in resolved)) fail(name, `unknown option '${name}'. Accepted options: ${Object.keys(resolved).join(', ')}.`);
    if (value === undefined) continue;
    if (name === 'root') {
      if (typeof value !== 'string' || !/^(\/[^/\0]+)+$/.test(value) || value.split('/').some((s) => s === '.' || s === '..')) {
        fail(name, `option 'root' must be an absolute ZooKeeper path like '/locks' (no trailing '/', no '.' or '..'), got ${show(value)}.`);
      }
      resolved.root = value;
      continue;
    }
    if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0 || value > MAX_TIMER_MS) {
      fail(name, `option '${name}' must be a positive finite number of milliseconds, got ${show(value)}.`);
    }
    resolved[name as 'sessionTimeout' | 'commandTimeout'] = Math.ceil(value);
  }
  return resolved;
}

function show(value: unknown): string {
  if (typeof value === 'string') return `'${value}'`;
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object' && value !== null) return 'an object';
  return String(value);
}
