// Builds the published package: ESM in dist/ and CommonJS in dist/cjs/, each with its own type
// declarations. `node scripts/build.mjs [outDir]` (default: dist).
import { execFileSync } from 'node:child_process';
import { rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '..');
const out = resolve(process.argv[2] ?? join(root, 'dist'));
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');

// No files left over from an older build: everything in dist/ is published.
rmSync(out, { recursive: true, force: true });
execFileSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json'), '--outDir', out], { stdio: 'inherit' });
execFileSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build-cjs.json'), '--outDir', join(out, 'cjs')], { stdio: 'inherit' });
// The package is "type": "module"; this makes Node (and TypeScript) read dist/cjs/*.js as CommonJS.
writeFileSync(join(out, 'cjs', 'package.json'), '{ "type": "commonjs" }\n');
