import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * A throwaway certificate authority, and a server and a client certificate it signed: the
 * server's as files (for redis-server), what a client needs as PEM text (for ioredis's `tls`).
 */
export interface TestCertificates {
  /** The CA's certificate: what a client trusts (`tls: { ca }`), and what a server checks clients by. */
  readonly ca: string;
  readonly caFile: string;
  readonly certFile: string;
  readonly keyFile: string;
  /** For a server that asks clients for a certificate (`tls: { ca, cert, key }`). */
  readonly client: { readonly cert: string; readonly key: string };
}

/**
 * Makes them in `dir` with the openssl command (Node can check certificates but not issue them).
 * EC keys, made in milliseconds. The server's certificate names 127.0.0.1 and localhost. Valid for
 * a day: enough for a test run, useless if the directory were ever left behind.
 */
export function createTestCertificates(dir: string): TestCertificates {
  const file = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  const newKey = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  openssl('req', '-x509', ...newKey, '-keyout', file('ca.key'), '-out', file('ca.crt'), '-days', '1', '-subj', '/CN=test CA');
  const sign = (name: string, extensions: string) => {
    openssl('req', ...newKey, '-keyout', file(`${name}.key`), '-out', file(`${name}.csr`), '-subj', `/CN=${name}`);
    writeFileSync(file(`${name}.ext`), `${extensions}\n`);
    openssl(
      ...['x509', '-req', '-in', file(`${name}.csr`), '-CA', file('ca.crt'), '-CAkey', file('ca.key'), '-CAcreateserial'],
      ...['-out', file(`${name}.crt`), '-days', '1', '-extfile', file(`${name}.ext`)],
    );
  };
  sign('server', 'subjectAltName=IP:127.0.0.1,DNS:localhost');
  sign('client', 'extendedKeyUsage=clientAuth');
  return {
    ca: readFileSync(file('ca.crt'), 'utf8'),
    caFile: file('ca.crt'),
    certFile: file('server.crt'),
    keyFile: file('server.key'),
    client: { cert: readFileSync(file('client.crt'), 'utf8'), key: readFileSync(file('client.key'), 'utf8') },
  };
}
