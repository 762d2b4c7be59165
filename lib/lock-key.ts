import { InvalidLockKeyError } from './lock.errors.js';
import type { ParameterInfo } from './parameter-names.js';

/** A key part a function may return; numbers and strings with the same text are the same key. */
export type LockKeyValue = string | number | bigint;

/** Derives the key (or keys) from the decorated method's arguments. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- any method: with unknown[], (id: number) => ... would not be assignable
export type LockKeyFunction<A extends unknown[] = any[]> = (...args: A) => LockKeyValue | readonly LockKeyValue[];

/**
 * What @Locked accepts: a template such as `'order:<id>'` (`<name>` is a parameter, `<0>` an
 * argument index, `<dto.items.0.sku>` a property path), a function of the arguments, or an array
 * of these to lock several keys together.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- any method: with unknown[], (id: number) => ... would not be assignable
export type LockKeySource<A extends unknown[] = any[]> = string | LockKeyFunction<A> | readonly (string | LockKeyFunction<A>)[];

/** Where a key came from, for error messages: `OrderService.pay`. */
export interface KeyOrigin {
  className: string;
  methodName: string;
}

/** `rest`: the placeholder names a rest parameter, whose value is the array of the arguments from argIndex on. */
type Part = string | { placeholder: string; argIndex: number; rest: boolean; path: string[] };

/** A key source checked against the method's parameters once, then resolved per call cheaply. */
export type KeyResolver = (args: readonly unknown[], encodeValues?: boolean) => string[];

const PLACEHOLDER = /<([^<>]*)>/g;
const SEGMENT = /^(?:[A-Za-z_$][\w$]*|\d+)$/;

/**
 * Checks every template against the method's parameter names and returns the resolver used on
 * each call. Throws InvalidLockKeyError naming the class, method and template when a template
 * refers to something that does not exist.
 */
export function compileKeySource(source: LockKeySource, origin: KeyOrigin, params: readonly ParameterInfo[] | undefined): KeyResolver {
  const items = Array.isArray(source) ? source : [source];
  const where = `${origin.className}.${origin.methodName}`;
  if (items.length === 0) {
    throw new InvalidLockKeyError(`@Locked on ${where} has an empty key list. Give at least one key template, e.g. @Locked('order:<id>').`);
  }
  const resolvers = items.map((item): KeyResolver => {
    if (typeof item === 'function') return (args) => fromFunction(item, args, where);
    if (typeof item !== 'string') {
      throw new InvalidLockKeyError(
        `@Locked on ${where}: a key must be a template string or a function of the arguments, got ${describe(item)}.`,
      );
    }
    const parts = parseTemplate(item, where, params);
    return (args, encodeValues) => [render(parts, item, args, where, encodeValues)];
  });
  return resolvers.length === 1 ? resolvers[0] : (args, encodeValues) => resolvers.flatMap((resolve) => resolve(args, encodeValues));
}

/**
 * The key as declared, for events and metrics: one value per method, whatever the arguments. A key
 * function shows as `Class.method()`; several keys are joined by `,`.
 */
export function keySourceTemplate(source: LockKeySource, origin: KeyOrigin): string {
  const items: readonly unknown[] = Array.isArray(source) ? source : [source];
  return items.map((item) => (typeof item === 'string' ? item : `${origin.className}.${origin.methodName}()`)).join(',');
}

function parseTemplate(template: string, where: string, params: readonly ParameterInfo[] | undefined): Part[] {
  if (template.length === 0) {
    throw new InvalidLockKeyError(`@Locked on ${where} has an empty key template. Use a template such as 'order:<id>'.`);
  }
  const parts: Part[] = [];
  let last = 0;
  for (const match of template.matchAll(PLACEHOLDER)) {
    if (match.index > last) parts.push(template.slice(last, match.index));
    last = match.index + match[0].length;
    const path = match[1].split('.');
    if (!path.every((segment) => SEGMENT.test(segment))) {
      throw new InvalidLockKeyError(
        `@Locked on ${where}: placeholder '${match[0]}' in template '${template}' is not a parameter name, an argument index or a dotted path such as <dto.items.0.sku>.`,
      );
    }
    const head = path[0];
    const byIndex = /^\d+$/.test(head);
    const argIndex = byIndex ? Number(head) : (params?.findIndex((p) => p.name === head) ?? -1);
    if (argIndex < 0) {
      const known = params?.map((p) => p.name).filter((n) => n !== undefined) ?? [];
      throw new InvalidLockKeyError(
        `@Locked on ${where}: template '${template}' refers to parameter '${head}', but ` +
          (params
            ? `the method's parameters are (${known.join(', ') || 'none'}). Fix the name, or use an index such as <0>.`
            : `its parameter names could not be read from the source. Use an index such as <0> instead.`),
      );
    }
    // An index is an argument's position: past a rest parameter it is one of the rest.
    const param = params?.[argIndex];
    const rest = !byIndex && param?.rest === true;
    if (param?.hasDefault) refuseDefault(where, template, match[0], param.name);
    if (rest && path.length === 1) {
      throw new InvalidLockKeyError(
        `@Locked on ${where}: template '${template}' refers to the rest parameter '${head}', the array of the remaining arguments, ` +
          `which is not one key. Name one of them, such as <${head}.0>, or lock each with a key function: ` +
          `@Locked((...${head}) => ${head}.map((x) => \`key:\${x}\`)).`,
      );
    }
    parts.push({ placeholder: match[0], argIndex, rest, path: path.slice(1) });
  }
  if (last < template.length) parts.push(template.slice(last));
  const literal = parts.filter((p): p is string => typeof p === 'string').join('');
  if (literal.includes('<') || literal.includes('>')) {
    throw new InvalidLockKeyError(
      `@Locked on ${where}: template '${template}' has an unmatched '<' or '>'. Placeholders look like <id>; angle brackets are reserved for them.`,
    );
  }
  return parts;
}

/**
 * Why refuse rather than apply the default: a default is an expression the method evaluates when
 * it runs (it may read `this`, other parameters or the clock), while the key is computed before
 * the call from the arguments as passed, so an omitted argument would be undefined there.
 * Evaluating the default a second time could give another value than the method's.
 */
function refuseDefault(where: string, template: string, placeholder: string, name: string | undefined): never {
  const param = name ?? 'value';
  throw new InvalidLockKeyError(
    `@Locked on ${where}: template '${template}' refers to parameter '${name ?? placeholder}', which has a default value: ` +
      `the key is computed from the arguments before the method runs, so ${placeholder} would not see the default when ` +
      `the argument is omitted. Remove the default (let the caller or a pipe supply the value), or use a key function ` +
      `with the same default, e.g. @Locked((${param} = …) => \`key:\${${param}}\`).`,
  );
}

/**
 * With `encodeValues`, each placeholder's value is percent-encoded (encodeURIComponent): with
 * `order:<a>:<b>`, ('x:y', 'z') and ('x', 'y:z') would otherwise lock the same key, and a `}` in a
 * value would end a Redis Cluster hash tag the template opened (`order:{<id>}:payment`). Letters,
 * digits and `-_.!~*'()` are left as they are, so plain ids give the same key either way.
 */
function render(parts: Part[], template: string, args: readonly unknown[], where: string, encodeValues = false): string {
  let key = '';
  for (const part of parts) {
    if (typeof part === 'string') {
      key += part;
      continue;
    }
    let value: unknown = part.rest ? args.slice(part.argIndex) : args[part.argIndex];
    for (const segment of part.path) {
      value = value === null || value === undefined ? undefined : (value as Record<string, unknown>)[segment];
    }
    const text = keyText(value, () => `${part.placeholder} in template '${template}' on ${where}`);
    key += encodeValues ? encodeURIComponent(text) : text;
  }
  return key;
}

function fromFunction(fn: LockKeyFunction, args: readonly unknown[], where: string): string[] {
  const result = fn(...args);
  const values = Array.isArray(result) ? result : [result];
  if (values.length === 0) {
    throw new InvalidLockKeyError(`The key function of @Locked on ${where} returned an empty array. Return at least one key.`);
  }
  return values.map((value) => keyText(value, () => `the key function of @Locked on ${where}`));
}

/** The text a value contributes to a key; refuses anything that would lock the wrong thing. */
export function keyText(value: unknown, what: () => string): string {
  if (typeof value === 'string') {
    if (value.length > 0) return value;
  } else if (typeof value === 'number') {
    if (Number.isFinite(value)) return String(value);
  } else if (typeof value === 'bigint') {
    return String(value);
  }
  throw new InvalidLockKeyError(
    `${what()} resolved to ${describe(value)}. A key part must be a non-empty string or a finite number; ` +
      `check that the argument is passed and validated (for example with a ParseIntPipe or a required DTO field).`,
  );
}

function describe(value: unknown): string {
  if (value === '') return "an empty string ''";
  if (value === null || value === undefined) return String(value);
  if (typeof value === 'number') return String(value);
  if (typeof value === 'function') return 'a function';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `${typeof value} ${String(value)}`;
}

/** What LockService accepts: one key, or several to lock together. */
export type LockKeys = string | readonly string[];

/**
 * Prefixes, checks, de-duplicates and sorts keys given to LockService: one global order means no
 * lock-order deadlock.
 */
export function fullLockKeys(keys: LockKeys, options: { keyPrefix: string; maxKeyLength: number }): string[] {
  // One key, the usual case: nothing to de-duplicate or sort.
  if (typeof keys === 'string') return [fullLockKey(keys, options)];
  if (!Array.isArray(keys) || keys.length === 0) {
    throw new InvalidLockKeyError(`Lock keys must be a non-empty string or a non-empty array of strings, got ${describeKeys(keys)}.`);
  }
  // What a one-key @Locked template resolves to.
  if (keys.length === 1) return [fullLockKey(keys[0], options)];
  return [...new Set(keys.map((key) => fullLockKey(key, options)))].sort();
}

/** One key checked and prefixed. */
function fullLockKey(key: unknown, { keyPrefix, maxKeyLength }: { keyPrefix: string; maxKeyLength: number }): string {
  if (typeof key !== 'string' || key.length === 0) {
    throw new InvalidLockKeyError(`A lock key must be a non-empty string, got ${describeKeys(key)}. Name what you lock, e.g. 'order:42'.`);
  }
  const prefixed = keyPrefix + key;
  if (prefixed.length > maxKeyLength) {
    throw new InvalidLockKeyError(
      `Lock key ${quoteKey(prefixed.slice(0, 60))}… is ${prefixed.length} characters long, over maxKeyLength ${maxKeyLength}. ` +
        `Lock an identifier rather than a payload, or raise maxKeyLength in DistributedLockModule.forRoot().`,
    );
  }
  checkKeyCharacters(prefixed);
  return prefixed;
}

function describeKeys(value: unknown): string {
  if (value === '') return "''";
  if (Array.isArray(value)) return value.length === 0 ? 'an empty array' : 'an array';
  return typeof value === 'string' ? `'${value}'` : String(value);
}

/** C0 and C1 control characters, DEL included. */
// eslint-disable-next-line no-control-regex -- control characters are what it looks for
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/**
 * Refuses what a key must not contain. A control character forges log lines wherever the key is
 * printed, and a line break would make a multi-key request share its process's queue with an
 * unrelated one (queues are named by the keys joined with one). A lone surrogate is a different
 * key here than in Redis, which stores it as the same replacement bytes as any other lone one.
 */
export function checkKeyCharacters(key: string): void {
  // Most keys are plain text: one pass over the code units clears them (the two regular
  // expressions on every key were 3% of an in-memory acquire+release).
  let suspect = false;
  for (let i = 0; i < key.length && !suspect; i++) {
    const unit = key.charCodeAt(i);
    suspect = unit < 0x20 || (unit >= 0x7f && unit <= 0x9f) || (unit >= 0xd800 && unit <= 0xdfff);
  }
  if (!suspect) return;
  let problem: string | undefined;
  if (CONTROL.test(key)) problem = 'contains a control character (a line break, tab, NUL or the like)';
  else if (LONE_SURROGATE.test(key)) problem = 'is not well-formed Unicode (it has a lone surrogate, half of a character)';
  if (problem === undefined) return;
  throw new InvalidLockKeyError(
    `Lock key ${quoteKey(key.slice(0, 60))}${key.length > 60 ? '…' : ''} ${problem}. Lock an identifier: validate the value ` +
      `before it reaches the lock (for example with a ParseIntPipe or a DTO pattern).`,
  );
}

/** A key for a message: quoted, with control characters and lone surrogates escaped, never raw. */
export function quoteKey(key: string): string {
  return JSON.stringify(key);
}
