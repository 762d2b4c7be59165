// Jest globalSetup of the consumer tests: builds the package and packs it with `npm pack`, as it
// would be published, into a scratch directory; the tests install that tarball into fresh apps.
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '../..');

export default function pack() {
  // NDL_TARBALL set by the caller: the apps install that tarball instead (a release, an older build).
  if (process.env.NDL_TARBALL) return;
  const dir = mkdtempSync(join(tmpdir(), 'ndl-pack-'));
  const source = join(dir, 'package');
  // Built into a copy, not the repo's dist/, which other test files load while this runs.
  execFileSync(process.execPath, [join(root, 'scripts/build.mjs'), join(source, 'dist')], { stdio: 'inherit' });
  for (const file of ['package.json', 'README.md']) copyFileSync(join(root, file), join(source, file));
  execFileSync('npm', ['pack', '--silent', '--pack-destination', dir], {
    cwd: source,
    env: npmEnv(),
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const tarball = readdirSync(dir).find((name) => name.endsWith('.tgz'));
  if (!tarball) throw new Error(`npm pack left no tarball in ${dir}`);
  process.env.NDL_PACK_DIR = dir;
  process.env.NDL_TARBALL = join(dir, tarball);
}

/** The environment without what `npm test` sets for its own package (prefix, scripts, ...). */
function npmEnv() {
  return Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^npm_/i.test(name) && name !== 'INIT_CWD'));
}
