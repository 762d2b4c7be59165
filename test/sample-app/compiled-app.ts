import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '../..');

/**
 * The shop compiled as users run it (`npm test` builds it first, in pretest): plain JS that
 * loads the library through its package entry, dist/.
 */
export function compiledShop(file: 'main.js' | 'demo.js'): string {
  const path = join(root, 'dist-dev/sample-app', file);
  if (!existsSync(path)) throw new Error(`${path} is missing: run \`npm run build:sample\` (npm test does it in pretest).`);
  return path;
}
