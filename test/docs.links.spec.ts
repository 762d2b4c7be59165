/**
 * Every relative link of README.md, docs/*.md, bench/README.md and sample-app/README.md points at a
 * file of this repository, and every `#anchor` at a heading of the file it names (as GitHub makes
 * anchors of headings), so a page that moves or a heading that is renamed cannot leave a dead link.
 */
import { describe, expect, it } from '@jest/globals';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

function markdownFiles(): string[] {
  const docs = readdirSync(join(root, 'docs'))
    .filter((name) => name.endsWith('.md'))
    .map((name) => join('docs', name));
  return ['README.md', 'bench/README.md', 'sample-app/README.md', ...docs];
}

/** The text outside fenced code blocks and inline code, where links are links. */
function prose(markdown: string): string {
  // A code span opens with a run of backticks and closes at the next run of the same length.
  return withoutFences(markdown).replace(/(?<!`)(`+)(?!`)[\s\S]*?(?<!`)\1(?!`)/g, '');
}

function withoutFences(markdown: string): string {
  return markdown.replace(/^[ \t]*```[^\n]*\n[\s\S]*?^[ \t]*```/gm, '');
}

/** GitHub's anchors: lower case, punctuation dropped, spaces as '-', repeats numbered '-1', '-2'. */
function anchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const result = new Set<string>();
  const headings = withoutFences(markdown).matchAll(/^#{1,6}\s+(.*)$/gm);
  for (const [, text] of headings) {
    const slug = text
      .trim()
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const count = seen.get(slug) ?? 0;
    seen.set(slug, count + 1);
    result.add(count === 0 ? slug : `${slug}-${count}`);
  }
  return result;
}

/** `file: link` for every relative link that names no file, or a heading its file does not have. */
function deadLinks(): string[] {
  const dead: string[] = [];
  for (const file of markdownFiles()) {
    const text = prose(readFileSync(join(root, file), 'utf8'));
    for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
      const [path, anchor] = target.split('#');
      const resolved = path ? join(root, dirname(file), path) : join(root, file);
      if (!existsSync(resolved)) {
        dead.push(`${file}: ${target} (no ${relative(root, resolved)})`);
      } else if (anchor !== undefined && resolved.endsWith('.md') && !anchors(readFileSync(resolved, 'utf8')).has(anchor)) {
        dead.push(`${file}: ${target} (no heading #${anchor} in ${relative(root, resolved)})`);
      }
    }
  }
  return dead;
}

describe('links in README.md and docs/', () => {
  it('finds the links (a changed pattern would silently check none)', () => {
    const readme = prose(readFileSync(join(root, 'README.md'), 'utf8'));
    expect([...readme.matchAll(/\]\(([^)\s]+)\)/g)].length).toBeGreaterThanOrEqual(10);
  });

  it('every relative link names a file, and every anchor a heading of it', () => {
    expect(deadLinks()).toEqual([]);
  });
});
