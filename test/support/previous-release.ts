import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';

/**
 * The packed package of the previous release (test/fixtures/previous-release/*.tgz, made by
 * `npm pack` at the commit its name gives), unpacked once into node_modules/.cache, where its
 * own imports (ioredis, pg, @nestjs/common ...) resolve to this project's packages. Returns the
 * path of its ESM entry point, for a child process's `LOCK_LIBRARY`.
 *
 * When a change alters what the library stores, replace the tarball with one packed at the commit
 * before it: processes of the two versions then share a store in the rolling-upgrade test.
 * `release-before-identity` is an older one, from before who holds a lock was stored: the tests of
 * who holds and waits run beside a process that stores nobody.
 */
export function previousRelease(fixture: 'previous-release' | 'release-before-identity' = 'previous-release'): {
  entry: string;
  name: string;
} {
  const root = resolve(import.meta.dirname, '../..');
  const dir = join(root, 'test/fixtures', fixture);
  const [tarball] = readdirSync(dir).filter((file) => file.endsWith('.tgz'));
  if (!tarball) throw new Error(`No packed previous release in ${dir}`);
  const name = tarball.replace(/\.tgz$/, '');
  const target = join(root, 'node_modules/.cache/previous-release', name);
  if (!existsSync(join(target, 'package.json'))) {
    // Unpacked beside its place, then moved there whole: two test files may race to do it.
    const parent = join(target, '..');
    mkdirSync(parent, { recursive: true });
    const scratch = mkdtempSync(join(parent, '.unpacking-'));
    execFileSync('tar', ['-xzf', join(dir, tarball), '-C', scratch]);
    try {
      renameSync(join(scratch, 'package'), target);
    } catch (error) {
      if (!existsSync(join(target, 'package.json'))) throw error;
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
  }
  return { entry: join(target, 'dist/index.js'), name };
}
