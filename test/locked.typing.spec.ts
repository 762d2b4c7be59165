import 'reflect-metadata';
import { describe, expect, it } from '@jest/globals';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { of, type Observable } from 'rxjs';
import ts from 'typescript';
import { Locked } from '../lib/index.js';

// This class is the type-level test: `tsc -p tsconfig.json --noEmit` (pretest) and ts-jest compile
// it, and an `@ts-expect-error` on a line that is not an error fails that compile.
export class Usages {
  @Locked('a:<id>')
  async asyncMethod(id: string) {
    return id;
  }

  @Locked('a:<id>')
  promise(id: string): Promise<string> {
    return Promise.resolve(id);
  }

  @Locked('a:<id>')
  observable(id: string): Observable<string> {
    return of(id);
  }

  @Locked('a:<id>')
  inferredObservable(id: string) {
    return of(id);
  }

  @Locked('a:<id>')
  static async staticMethod(id: string) {
    return id;
  }

  // @ts-expect-error a plain value returned synchronously: the caller would get a Promise instead
  @Locked('a:<id>')
  length(id: string): number {
    return id.length;
  }

  // @ts-expect-error a controller handler answering synchronously must be async
  @Locked('a:<id>')
  handler(id: string) {
    return { id };
  }

  // @ts-expect-error nothing returned: nothing would tell the caller when the locked work ended
  @Locked('a:<id>')
  fireAndForget(id: string) {
    void id;
  }

  // @ts-expect-error static methods are held to the same rule
  @Locked('a:<id>')
  static staticSync(id: string) {
    return id;
  }
}

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** Type-checks `source` as a file of test/, against the library's sources. */
function typeErrors(source: string): string[] {
  const file = path.join(root, 'test', 'typing-probe.ts');
  const options: ts.CompilerOptions = {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    lib: ['lib.es2022.d.ts', 'lib.esnext.disposable.d.ts'],
    strict: true,
    experimentalDecorators: true,
    emitDecoratorMetadata: true,
    skipLibCheck: true,
    types: ['node'],
    noEmit: true,
  };
  const host = ts.createCompilerHost(options);
  const { getSourceFile, fileExists, readFile } = host;
  host.getSourceFile = (name, version, ...rest) =>
    name === file ? ts.createSourceFile(name, source, version) : getSourceFile.call(host, name, version, ...rest);
  host.fileExists = (name) => name === file || fileExists.call(host, name);
  host.readFile = (name) => (name === file ? source : readFile.call(host, name));
  const program = ts.createProgram([file], options, host);
  return ts
    .getPreEmitDiagnostics(program)
    .filter((d) => d.file?.fileName === file)
    .map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
}

describe('@Locked types', () => {
  it('refuses at compile time a method that returns a plain value, saying to make it async', () => {
    const errors = typeErrors(`
      import { Locked } from '../lib/index.js';
      export class Orders {
        @Locked('order:<id>')
        total(id: string): number {
          return id.length;
        }
        @Locked('order:<id>')
        async paid(id: string) {
          return id;
        }
      }
    `);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toContain('@Locked needs a method that returns a Promise (make it async) or an Observable');
  }, 60_000);
});
