/**
 * Every ```ts block of README.md and docs/*.md compiles in strict mode against the library's
 * sources ('nest-distributed-lock' maps to lib/index.ts), so an example a user copies compiles.
 *
 * Convention for authors:
 * - A ```ts block is a whole module: it imports what it uses, as a user's file would. Each block
 *   is compiled as a file of its own (top-level `await` works; names do not clash across blocks).
 * - A block that cannot stand alone (a method without its class, shown for its shape) is marked
 *   ```ts fragment: it is shown, not compiled. Keep those few.
 * - Packages an example names that this repository does not install (@nestjs/config,
 *   @nestjs/schedule) get the small declarations below, the part of their API the docs use.
 */
import { describe, expect, it } from '@jest/globals';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

const STUBS = `
declare module '@nestjs/config' {
  import type { DynamicModule } from '@nestjs/common';
  export class ConfigModule {
    static forRoot(options?: object): DynamicModule;
  }
  export class ConfigService {
    get<T = string>(key: string): T | undefined;
    getOrThrow<T = string>(key: string): T;
  }
}
declare module '@nestjs/schedule' {
  export function Cron(expression: string): MethodDecorator;
}
`;

interface CodeBlock {
  file: string;
  line: number;
  code: string;
}

/** The ```ts blocks of one Markdown file, with the line each starts on; fragments left out. */
function tsBlocks(file: string, markdown: string): CodeBlock[] {
  const blocks: CodeBlock[] = [];
  const lines = markdown.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\S*)\s*(.*)$/.exec(lines[i]);
    if (!open) continue;
    const end = lines.findIndex((l, j) => j > i && l.startsWith('```'));
    if (end < 0) throw new Error(`${file}:${i + 1}: a code block that never closes`);
    if (open[1] === 'ts' && !/\bfragment\b/.test(open[2])) {
      blocks.push({ file, line: i + 2, code: lines.slice(i + 1, end).join('\n') });
    }
    i = end;
  }
  return blocks;
}

function markdownFiles(): string[] {
  const docs = readdirSync(join(root, 'docs'))
    .filter((name) => name.endsWith('.md'))
    .map((name) => join('docs', name));
  return ['README.md', ...docs];
}

/** Compiles the blocks, one file each, and returns the errors as `README.md:42: message`. */
function typeCheck(blocks: CodeBlock[]): string[] {
  // Inside node_modules, so the blocks resolve packages as a user's app does.
  const cache = join(root, 'node_modules', '.cache');
  mkdirSync(cache, { recursive: true });
  const dir = mkdtempSync(join(cache, 'docs-code-blocks-'));
  try {
    const files = blocks.map((block, i) => {
      const path = join(dir, `block-${i}.ts`);
      // `export {}` makes every block a module, even one without imports.
      writeFileSync(path, `${block.code}\nexport {};\n`);
      return path;
    });
    const stubs = join(dir, 'stubs.d.ts');
    writeFileSync(stubs, STUBS);
    const program = ts.createProgram([...files, stubs], {
      target: ts.ScriptTarget.ES2022,
      lib: ['lib.es2022.d.ts', 'lib.esnext.disposable.d.ts'],
      module: ts.ModuleKind.ESNext,
      moduleResolution: ts.ModuleResolutionKind.Bundler,
      strict: true,
      noImplicitOverride: true,
      experimentalDecorators: true,
      emitDecoratorMetadata: true,
      skipLibCheck: true,
      esModuleInterop: true,
      noEmit: true,
      types: ['node'],
      paths: {
        'nest-distributed-lock': [join(root, 'lib', 'index.ts')],
        'nest-distributed-lock/testing': [join(root, 'lib', 'testing', 'index.ts')],
      },
    });
    const byFile = new Map(files.map((path, i) => [path, blocks[i]]));
    return ts.getPreEmitDiagnostics(program).map((d) => {
      const message = ts.flattenDiagnosticMessageText(d.messageText, '\n');
      const block = d.file && byFile.get(d.file.fileName);
      if (!d.file || !block) return `${d.file ? relative(root, d.file.fileName) : '(config)'}: ${message}`;
      const { line } = d.file.getLineAndCharacterOfPosition(d.start ?? 0);
      return `${block.file}:${block.line + line}: ${message}`;
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('code blocks in README.md and docs/', () => {
  const blocks = markdownFiles().flatMap((file) => tsBlocks(file, readFileSync(join(root, file), 'utf8')));

  it('finds the examples (a renamed fence would silently skip them)', () => {
    expect(blocks.filter((b) => b.file === 'README.md').length).toBeGreaterThanOrEqual(3);
    expect(blocks.filter((b) => b.file.startsWith('docs')).length).toBeGreaterThanOrEqual(15);
  });

  it('every ```ts block compiles in strict mode against the library', () => {
    expect(typeCheck(blocks)).toEqual([]);
  }, 120_000);
});
