import type { ModulesContainer } from '@nestjs/core';
import type { DistributedLockModuleOptions } from './distributed-lock.options.js';
import { InvalidLockOptionsError } from './lock.errors.js';
import type { LockService } from './lock.service.js';
import { processShared } from './process-shared.js';

interface Registered {
  options: DistributedLockModuleOptions;
  service: LockService;
}

/**
 * One LockService per application, whatever the number of modules that import
 * DistributedLockModule. Nest makes a module instance per `forRoot()` call: each feature module
 * that imports it would get its own service (on the in-memory backend, its own store), @Locked
 * methods would be bound to whichever ran last, and a @Locked method and `using()` on the same key
 * would not exclude each other. Keyed by the application's module container, which each Nest app
 * has one of; shared by both builds of the package (processShared).
 */
const applications = processShared('application-lock-services@1', () => new WeakMap<object, Registered>());

/**
 * The application's LockService: the one created for an earlier import of the module when this
 * import has the same options, else a new one (the first import). Options that differ fail
 * start-up with what to change.
 */
export function applicationLockService(
  container: ModulesContainer,
  options: DistributedLockModuleOptions | undefined,
  create: () => LockService,
): LockService {
  const given = options ?? {};
  const registered = applications.get(container);
  if (!registered) {
    const service = create();
    applications.set(container, { options: given, service });
    return service;
  }
  const differing = differingOptions(registered.options, given);
  if (differing.length === 0) return registered.service;
  const importers = importingModules(container);
  throw new InvalidLockOptionsError(
    differing[0],
    `DistributedLockModule is imported more than once in this application${importers ? ` (by ${importers})` : ''} with different ` +
      `options (${differing.join(', ')}). An application has one lock registry, so that @Locked methods and LockService calls on ` +
      `the same key exclude each other. Import DistributedLockModule.forRoot(...) (or forRootAsync) once, in the root module, ` +
      `with isGlobal: true, and remove it from the other modules: they get LockService from it. Or give every import the same ` +
      `options (the same backend instance, not two backends).`,
  );
}

/** The top-level options that differ; plain objects and arrays compare by content, anything else (a backend, a meter) by identity. */
function differingOptions(a: DistributedLockModuleOptions, b: DistributedLockModuleOptions): string[] {
  const names = new Set([...Object.keys(a), ...Object.keys(b)]);
  const left = a as Record<string, unknown>;
  const right = b as Record<string, unknown>;
  return [...names].filter((name) => !same(left[name], right[name]));
}

function same(a: unknown, b: unknown): boolean {
  if (Object.is(a, b)) return true;
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((value, i) => same(value, b[i]));
  if (!isPlain(a) || !isPlain(b)) return false;
  const names = new Set([...Object.keys(a), ...Object.keys(b)]);
  return [...names].every((name) => same(a[name], b[name]));
}

function isPlain(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null) return false;
  const proto = Object.getPrototypeOf(value) as unknown;
  return proto === Object.prototype || proto === null;
}

/** The modules that import DistributedLockModule, by class name, for the error. */
function importingModules(container: ModulesContainer): string {
  const names = new Set<string>();
  for (const module of container.values()) {
    for (const imported of module.imports) {
      if (imported?.metatype?.name === 'DistributedLockModule') names.add(module.metatype?.name ?? module.name);
    }
  }
  return [...names].join(', ');
}
