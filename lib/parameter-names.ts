import { parse } from 'acorn';

type AnyClass = abstract new (...args: never[]) => unknown;

const cache = new WeakMap<AnyClass, Map<string, (string | undefined)[]>>();

/**
 * The declared parameter names of `methodName`, read from the class's own source text.
 *
 * Why the class and not the method: when another decorator wrapped the method before ours, the
 * function we see is `(...args) => ...`, but the class body still has the original signature.
 * A parameter without a plain name (destructured) is `undefined`: reach it with `<index>`.
 * Returns undefined when the source cannot be read (native or bound code).
 */
export function parameterNames(ctor: AnyClass, methodName: string): (string | undefined)[] | undefined {
  let methods = cache.get(ctor);
  if (!methods) {
    methods = readMethods(ctor);
    cache.set(ctor, methods);
  }
  return methods.get(methodName) ?? namesFromFunction((ctor.prototype as Record<string, unknown>)[methodName]);
}

interface ParamNode {
  type: string;
  name?: string;
  left?: ParamNode;
  argument?: ParamNode;
}

function paramName(node: ParamNode): string | undefined {
  if (node.type === 'Identifier') return node.name;
  if (node.type === 'AssignmentPattern' && node.left) return paramName(node.left);
  if (node.type === 'RestElement' && node.argument) return paramName(node.argument);
  return undefined;
}

function readMethods(ctor: AnyClass): Map<string, (string | undefined)[]> {
  const methods = new Map<string, (string | undefined)[]>();
  let program;
  try {
    program = parse(`(${Function.prototype.toString.call(ctor)})`, { ecmaVersion: 'latest' });
  } catch {
    return methods;
  }
  const statement = program.body[0];
  if (statement?.type !== 'ExpressionStatement' || statement.expression.type !== 'ClassExpression') return methods;
  for (const member of statement.expression.body.body) {
    if (member.type !== 'MethodDefinition' || member.static || member.kind !== 'method') continue;
    const key = member.key;
    const name = key.type === 'Identifier' && !member.computed ? key.name : key.type === 'Literal' ? String(key.value) : undefined;
    if (name !== undefined) methods.set(name, member.value.params.map((p) => paramName(p as ParamNode)));
  }
  return methods;
}

/** Fallback for methods not written in a class body (assigned to the prototype by hand). */
function namesFromFunction(fn: unknown): (string | undefined)[] | undefined {
  if (typeof fn !== 'function') return undefined;
  const source = Function.prototype.toString.call(fn);
  for (const candidate of [`(${source})`, `({${source}})`]) {
    try {
      const program = parse(candidate, { ecmaVersion: 'latest' });
      const statement = program.body[0];
      if (statement?.type !== 'ExpressionStatement') continue;
      const expr = statement.expression;
      if (expr.type === 'FunctionExpression' || expr.type === 'ArrowFunctionExpression') {
        return expr.params.map((p) => paramName(p as ParamNode));
      }
      if (expr.type === 'ObjectExpression' && expr.properties[0]?.type === 'Property') {
        const value = expr.properties[0].value;
        if (value.type === 'FunctionExpression') return value.params.map((p) => paramName(p as ParamNode));
      }
    } catch {
      // try the next wrapping
    }
  }
  return undefined;
}
