import { describe, expect, it } from '@jest/globals';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * docs/testing-your-app.md shows whole test files: each ```ts block names, after the language, the
 * file of test/testing/examples/ it is, and must equal it. Those files run with the other tests
 * (the package's names map to its sources), so every example on the page is a test that passes;
 * test/docs.code-blocks.spec.ts type-checks the blocks as it does every page's.
 */
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const page = 'docs/testing-your-app.md';
const examples = 'test/testing/examples';

function blocks(markdown: string): { info: string; code: string; line: number }[] {
  const found: { info: string; code: string; line: number }[] = [];
  const lines = markdown.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const open = /^```ts\b\s*(.*)$/.exec(lines[i]);
    if (!open) {
      if (lines[i].startsWith('```')) i = lines.findIndex((l, j) => j > i && l.startsWith('```'));
      continue;
    }
    const end = lines.findIndex((l, j) => j > i && l.startsWith('```'));
    found.push({ info: open[1].trim(), code: lines.slice(i + 1, end).join('\n'), line: i + 1 });
    i = end;
  }
  return found;
}

describe(page, () => {
  const shown = blocks(readFileSync(join(root, page), 'utf8'));

  it('shows every example file, each once', () => {
    const files = readdirSync(join(root, examples))
      .filter((name) => name.endsWith('.spec.ts'))
      .map((name) => `${examples}/${name}`);
    expect(files.length).toBeGreaterThanOrEqual(3);
    expect(shown.map((block) => block.info).sort()).toEqual(files.sort());
  });

  it('each block is its example file, as it runs', () => {
    for (const block of shown) {
      const file = readFileSync(join(root, block.info), 'utf8');
      expect({ line: block.line, code: block.code.trimEnd() }).toEqual({ line: block.line, code: file.trimEnd() });
    }
  });
});
