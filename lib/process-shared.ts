/**
 * One value per process for each name, shared by every copy of this module in the process. An app
 * can load both builds of this package (an ESM app whose CommonJS dependency requires it): each
 * build has its own module instances, and state kept in a module variable would split in two, e.g.
 * a lock held through one build would not count as held for the other. The name ends in a version
 * that changes whenever the shape of the value changes, so copies that disagree on it never share.
 */
export function processShared<T>(name: string, create: () => T): T {
  let value = registry.get(name) as T | undefined;
  if (value === undefined) registry.set(name, (value = create()));
  return value;
}

const slots = globalThis as unknown as Record<symbol, Map<string, unknown> | undefined>;
// A Map, not an object with the values as properties: Jest 30 rewrites the own properties of
// whatever a test file left on globalThis into accessors at teardown (and a later write to one
// recurses until the stack overflows); a Map has no own properties, its entries are left alone.
const registry = (slots[Symbol.for('nest-distributed-lock:process-shared')] ??= new Map<string, unknown>());
