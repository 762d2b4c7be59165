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
  /**
   * Digest credentials for the session (ZooKeeper's `addAuthInfo('digest', 'user:password')`),
   * also accepted in the connection string as `user:password@zk1:2181,zk2:2181`. With them, every
   * node the backend creates (lock nodes, each key's parent, the root when missing) gets an ACL
   * that gives this identity all rights and nobody else any: another client of a shared ensemble
   * cannot delete a holder's node. Without them nodes are open to every client (see
   * docs/security.md).
   */
  auth?: ZooKeeperDigestAuth;
}

/** A digest identity: `username` without ':', as ZooKeeper splits `user:password` at the first one. */
export interface ZooKeeperDigestAuth {
  username: string;
  password: string;
}

export interface ResolvedZooKeeperOptions {
  root: string;
  sessionTimeout: number;
  commandTimeout: number;
  auth: ZooKeeperDigestAuth | undefined;
}

/** What the connection string says: the servers (and chroot) the client gets, and any credentials in it. */
export interface ZooKeeperConnection {
  /** `host:port,...[/chroot]`, without credentials: what the client package is given. */
  servers: string;
  auth: ZooKeeperDigestAuth | undefined;
}

// Typed, so that TypeScript narrows a value after checks.fail(), which never returns.
const checks: BackendOptionChecks = new BackendOptionChecks('ZooKeeperLockBackend');

/**
 * The connection string as ZooKeeper clients take it: `host:port` pairs separated by commas,
 * optionally followed by a chroot path (`zk1:2181,zk2:2181,zk3:2181/app`), optionally led by
 * digest credentials (`user:password@zk1:2181,...`). The credentials end at the last '@', so a
 * password may hold '@', '/' or ','; they are percent-decoded as a URL's are ('%40' is '@').
 * Nothing of the password reaches a message: see redactConnection.
 */
export function checkConnectionString(value: unknown): ZooKeeperConnection {
  const how = "Pass a connection string like '127.0.0.1:2181' or 'zk1:2181,zk2:2181,zk3:2181'.";
  if (typeof value !== 'string' || value.trim() === '')
    checks.fail('connection', `expected a connection string, got ${show(value)}. ${how}`);
  const at = value.lastIndexOf('@');
  const servers = value.slice(at + 1);
  const auth = at < 0 ? undefined : credentials(value.slice(0, at), redactConnection(value));
  const slash = servers.indexOf('/');
  const hosts = slash < 0 ? servers : servers.slice(0, slash);
  const chroot = slash < 0 || slash === servers.length - 1 ? undefined : servers.slice(slash);
  const problem = chroot === undefined ? undefined : pathProblem(chroot);
  // Shown through show(), which masks what looks like a password in a URL's way too (`?password=`).
  if (problem)
    checks.fail('connection', `the chroot ${show(chroot)} in the connection string is not a ZooKeeper path (${problem}). ${how}`);
  for (const host of hosts.split(',')) {
    const match = /^([^:\s]+)(?::(\d+))?$/.exec(host.trim());
    const port = match?.[2] === undefined ? 2181 : Number(match[2]);
    if (!match || !(port > 0 && port < 65_536))
      checks.fail('connection', `${show(host)} in the connection string is not host:port. ${how}`);
  }
  return { servers, auth };
}

/**
 * A ZooKeeper connection string fit for a message or a log: the password of `user:password@hosts`
 * masked. (The shared redactUrl masks a URL's, after '//': a ZooKeeper string has no scheme, and
 * its credentials end at the last '@'.)
 */
export function redactConnection(text: string): string {
  const at = text.lastIndexOf('@');
  if (at < 0) return text;
  const colon = text.indexOf(':');
  return colon >= 0 && colon < at ? `${text.slice(0, colon)}:***${text.slice(at)}` : `***${text.slice(at)}`;
}

function credentials(userInfo: string, shown: string): ZooKeeperDigestAuth {
  const how = `Write them as 'user:password@zk1:2181' (percent-encode ':' in the user name), or pass the auth option.`;
  let decoded: [string, string];
  try {
    const colon = userInfo.indexOf(':');
    if (colon < 0) checks.fail('connection', `the credentials in '${shown}' have no password. ${how}`);
    decoded = [decodeURIComponent(userInfo.slice(0, colon)), decodeURIComponent(userInfo.slice(colon + 1))];
  } catch (error) {
    if (!(error instanceof URIError)) throw error;
    checks.fail('connection', `the credentials in '${shown}' are not percent-encoded correctly (write '%' as '%25'). ${how}`);
  }
  return checkAuth('connection', { username: decoded[0], password: decoded[1] });
}

/** A digest identity ZooKeeper can take: a user name without ':', and a password, neither empty. */
function checkAuth(option: string, value: unknown): ZooKeeperDigestAuth {
  const how = "Pass { username: 'locks', password: process.env.ZK_PASSWORD }.";
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    checks.fail(option, `option 'auth' must be digest credentials, got ${typeof value === 'string' ? 'a string' : show(value)}. ${how}`);
  }
  const { username, password, ...rest } = value as Record<string, unknown>;
  const unknown = Object.keys(rest);
  if (unknown.length > 0) checks.fail(option, `option 'auth' takes username and password only, got '${unknown[0]}'. ${how}`);
  if (typeof username !== 'string' || username === '' || username.includes(':')) {
    checks.fail(option, `the digest user name must be a non-empty string without ':' (ZooKeeper splits at the first one). ${how}`);
  }
  if (typeof password !== 'string' || password === '') checks.fail(option, `the digest password must be a non-empty string. ${how}`);
  return { username, password };
}

export function resolveOptions(options: unknown): ResolvedZooKeeperOptions {
  const resolved: ResolvedZooKeeperOptions = {
    root: '/nest-distributed-lock',
    sessionTimeout: 10_000,
    commandTimeout: 2_000,
    auth: undefined,
  };
  for (const [name, value] of checks.given(options, Object.keys(resolved), "{ root: '/locks', sessionTimeout: 10000 }")) {
    if (name === 'auth') {
      resolved.auth = checkAuth(name, value);
    } else if (name === 'root') {
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
