import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
// @ts-expect-error: a plain ESM script of the repo, without types.
import { DETECTORS, MUTANTS } from '../../scripts/mutants/mutants.mjs';

interface Mutant {
  name: string;
  file: string;
  replace: [string, string][];
  detector: string;
}

const root = resolve(import.meta.dirname, '../..');

/**
 * `npm run chaos:mutants` plants each bug by an exact search and replace, and stops when a search
 * text is gone (the code changed under it). That run comes last in CI; this finds a stale mutant in
 * the first minute instead.
 */
describe('the mutation set', () => {
  it.each((MUTANTS as Mutant[]).map((m): [string, Mutant] => [m.name, m]))(
    '%s plants its bug: each text it replaces is in its file exactly once',
    (_name, mutant) => {
      const text = readFileSync(join(root, mutant.file), 'utf8');
      for (const [search] of mutant.replace) expect({ search, count: text.split(search).length - 1 }).toEqual({ search, count: 1 });
      expect(Object.keys(DETECTORS as object)).toContain(mutant.detector);
    },
  );
});
