import { BackendOptionChecks } from '../backend-options.checks.js';
import { show } from '../../option-value.js';

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

// Typed, so that TypeScript narrows a value after checks.fail(), which never returns.
const checks: BackendOptionChecks = new BackendOptionChecks('ZooKeeperLockBackend');

/**
 * The connection string as ZooKeeper clients take it: `host:port` pairs separated by commas,
 * optionally followed by a chroot path (`zk1:2181,zk2:2181,zk3:2181/app`).
 */
export function checkConnectionString(value: unknown): string {
  const how = "Pass a connection string like '127.0.0.1:2181' or 'zk1:2181,zk2:2181,zk3:2181'.";
  if (typeof value !== 'string' || value.trim() === '')
    checks.fail('connection', `expected a connection string, got ${show(value)}. ${how}`);
  const slash = value.indexOf('/');
  const hosts = slash < 0 ? value : value.slice(0, slash);
  const chroot = slash < 0 || slash === value.length - 1 ? undefined : value.slice(slash);
  const problem = chroot === undefined ? undefined : pathProblem(chroot);
  if (problem) checks.fail('connection', `the chroot '${chroot}' in the connection string is not a ZooKeeper path (${problem}). ${how}`);
  for (const host of hosts.split(',')) {
    const match = /^([^:\s]+)(?::(\d+))?$/.exec(host.trim());
    const port = match?.[2] === undefined ? 2181 : Number(match[2]);
    if (!match || !(port > 0 && port < 65_536)) checks.fail('connection', `'${host}' in the connection string is not host:port. ${how}`);
  }
  return value;
}

export function resolveOptions(options: unknown): ResolvedZooKeeperOptions {
  const resolved: ResolvedZooKeeperOptions = { root: '/nest-distributed-lock', sessionTimeout: 10_000, commandTimeout: 2_000 };
  for (const [name, value] of checks.given(options, Object.keys(resolved), "{ root: '/locks', sessionTimeout: 10000 }")) {
    if (name === 'root') {
      const problem = pathProblem(value);
      if (problem) checks.fail(name, `option 'root' must be an absolute ZooKeeper path like '/locks' (${problem}), got ${show(value)}.`);
      if (value === '/zookeeper' || (value as string).startsWith('/zookeeper/')) {
        checks.fail(
          name,
          `option 'root' must not be under /zookeeper, ZooKeeper's own tree (quotas, configuration), got ${show(value)}. Use e.g. '/locks'.`,
        );
      }
      resolved.root = value as string;
    } else {
      resolved[name as 'sessionTimeout' | 'commandTimeout'] = checks.milliseconds(name, value);
    }
  }
  return resolved;
}

/**
 * Why `value` is not a path ZooKeeper takes, or undefined: its client refuses empty segments, '.'
 * and '..'; its server refuses control characters, surrogates (so emoji), private-use and
 * special characters, with an error at every request rather than at start-up.
 */
function pathProblem(value: unknown): string | undefined {
  if (typeof value !== 'string' || !value.startsWith('/')) return "it starts with '/'";
  if (value.length === 1 || value.endsWith('/')) return "no trailing '/'";
  const segments = value.split('/').slice(1);
  if (segments.some((segment) => segment === '' || segment === '.' || segment === '..')) return "no empty, '.' or '..' segment";
  // The ranges of ZooKeeper's PathUtils.validatePath, control characters included on purpose.
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f-\u009f\ud800-\uf8ff\ufff0-\uffff]/.test(value)) {
    return 'no control, surrogate (emoji), private-use or special characters';
  }
  return undefined;
}
