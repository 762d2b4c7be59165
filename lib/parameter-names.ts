import { parse } from 'acorn';

type AnyClass = abstract new (...args: never[]) => unknown;

/** One declared parameter, as the key templates need to know it. */
export interface ParameterInfo {
  /** Undefined for a destructured parameter: reach it with `<index>`. */
  name: string | undefined;
  /** `...name`: it receives the array of the remaining arguments. */
  rest: boolean;
  /** `name = value`: the method applies the default, which a key computed before the call cannot see. */
  hasDefault: boolean;
}

type Methods = Map<string, ParameterInfo[]>;

const cache = new WeakMap<AnyClass, { instance: Methods; static: Methods }>();

/**
 * The declared parameters of `methodName` (a static method when `isStatic`), read from the
 * class's own source text.
 *
 * Why the class and not the method: when another decorator wrapped the method before ours, the
 * function we see is `(...args) => ...`, but the class body still has the original signature.
 * Returns undefined when the source cannot be read (native or bound code).
 */
export function declaredParameters(ctor: AnyClass, methodName: string, isStatic = false): ParameterInfo[] | undefined {
  let methods = cache.get(ctor);
  if (!methods) {
    methods = readMethods(ctor);
    cache.set(ctor, methods);
  }
  const owner = (isStatic ? ctor : ctor.prototype) as Record<string, unknown>;
  return (isStatic ? methods.static : methods.instance).get(methodName) ?? namesFromFunction(owner[methodName]);
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

function paramInfo(node: ParamNode): ParameterInfo {
  return { name: paramName(node), rest: node.type === 'RestElement', hasDefault: node.type === 'AssignmentPattern' };
}

function readMethods(ctor: AnyClass): { instance: Methods; static: Methods } {
  const methods = { instance: new Map() as Methods, static: new Map() as Methods };
  let program;
  try {
    program = parse(`(${Function.prototype.toString.call(ctor)})`, { ecmaVersion: 'latest' });
  } catch {
    return methods;
  }
  const statement = program.body[0];
  if (statement?.type !== 'ExpressionStatement' || statement.expression.type !== 'ClassExpression') return methods;
  for (const member of statement.expression.body.body) {
    if (member.type !== 'MethodDefinition' || member.kind !== 'method') continue;
    const key = member.key;
    const name = key.type === 'Identifier' && !member.computed ? key.name : key.type === 'Literal' ? String(key.value) : undefined;
    const params = member.value.params.map((p) => paramInfo(p as ParamNode));
    if (name !== undefined) (member.static ? methods.static : methods.instance).set(name, params);
  }
  return methods;
}

/** Fallback for methods not written in a class body (assigned to the prototype by hand). */
function namesFromFunction(fn: unknown): ParameterInfo[] | undefined {
  if (typeof fn !== 'function') return undefined;
  const source = Function.prototype.toString.call(fn);
  for (const candidate of [`(${source})`, `({${source}})`]) {
    try {
      const program = parse(candidate, { ecmaVersion: 'latest' });
      const statement = program.body[0];
      if (statement?.type !== 'ExpressionStatement') continue;
      const expr = statement.expression;
      if (expr.type === 'FunctionExpression' || expr.type === 'ArrowFunctionExpression') {
        return expr.params.map((p) => paramInfo(p as ParamNode));
      }
      if (expr.type === 'ObjectExpression' && expr.properties[0]?.type === 'Property') {
        const value = expr.properties[0].value;
        if (value.type === 'FunctionExpression') return value.params.map((p) => paramInfo(p as ParamNode));
      }
    } catch {
      // try the next wrapping
    }
  }
  return undefined;
}
