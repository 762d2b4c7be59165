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

  // Key functions: annotated parameters must accept the method's arguments.
  @Locked((id: string) => `a:${id}`)
  async keyOfFirst(id: string, quantity: number) {
    return { id, quantity };
  }

  @Locked(['a:<id>', (id: string, quantity: number) => `q:${id}:${quantity}`])
  async keysOfBoth(id: string, quantity: number) {
    return { id, quantity };
  }

  @Locked((id: string | number, note?: string) => `a:${id}${note ?? ''}`)
  async wider(id: number) {
    return id;
  }

  // Unannotated: TypeScript types the parameters before it sees the method, so they are \`any\`.
  @Locked((id) => `a:${id}`)
  async unannotated(id: string) {
    return id;
  }

  // @ts-expect-error the key function takes a number, the method gets a string
  @Locked((id: number) => `a:${id}`)
  async wrongType(id: string) {
    return id;
  }

  // @ts-expect-error the key function needs a second argument that the method never gets
  @Locked((id: string, quantity: number) => `a:${id}:${quantity}`)
  async tooFew(id: string) {
    return id;
  }

  // @ts-expect-error one function of a key array is checked like a single one
  @Locked(['a:<id>', (id: number) => `a:${id}`])
  async inArray(id: string) {
    return id;
  }

  // @ts-expect-error static methods too
  @Locked((id: number) => `a:${id}`)
  static async staticWrongType(id: string) {
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

  it("refuses a key function whose parameters do not accept the method's arguments, saying so", () => {
    const errors = typeErrors(`
      import { Locked } from '../lib/index.js';
      export class Orders {
        @Locked((id: number) => 'order:' + id)
        async pay(id: string) {
          return id;
        }
        @Locked((id: string) => 'order:' + id)
        async refund(id: string, amount: number) {
          return amount;
        }
      }
    `);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toContain("@Locked key function: its parameters must accept the method's arguments");
  }, 60_000);
});
