/** Settings every project shares: TypeScript sources run as ESM through ts-jest. */
const base = {
  testEnvironment: 'node',
  extensionsToTreatAsEsm: ['.ts'],
  moduleNameMapper: {
    '^(\\.{1,2}/.*)\\.js$': '$1',
    // lib/peer-require.cts is imported as './peer-require.cjs', the name it has once built. Only
    // that file: packages' own .cjs files (the OpenTelemetry SDK's) are what they say.
    '^(\\.{1,2}/(?:.*/)?peer-require)\\.cjs$': '$1.cts',
    // The sample app imports the package by name; in tests that is the library's sources, the one
    // copy every test file loads (decorator metadata and AsyncLocalStorage must be shared).
    '^nest-distributed-lock$': '<rootDir>/lib/index.ts',
    '^nest-distributed-lock/testing$': '<rootDir>/lib/testing/index.ts',
  },
  // Transpiled file by file, not type-checked: `npm test` type-checks the whole tree once first
  // (tsc in pretest), and checking each test file again cost four times the run of a fast suite.
  transform: {
    '^.+\\.c?ts$': ['ts-jest', { useESM: true, tsconfig: 'tsconfig.jest.json' }],
  },
};

/** The Redis files that run a second time, on the other supported ioredis major. */
const secondIoredisFiles = [
  'test/backends/redis.conformance.spec.ts',
  'test/backends/redis.faults.spec.ts',
  'test/backends/redis.cluster.spec.ts',
  'test/backends/redis.client-version.spec.ts',
  'test/backends/redis.acl-tls.spec.ts',
];

/** @type {import('jest').Config} */
export default {
  testTimeout: 30000,
  // Two test files at a time on the 2-core CI machine: most of a file's time is spent waiting on
  // its servers (leases running out, restarts), so the whole suite takes about half as long
  // (885 s against 1 761 s of file time); each file still starts its own servers on free ports.
  maxWorkers: 2,
  projects: [
    {
      ...base,
      displayName: 'main',
      roots: ['<rootDir>/test'],
      testMatch: ['**/*.spec.ts'],
      testPathIgnorePatterns: ['/node_modules/', '<rootDir>/test/consumers/'],
      globals: { expectedIoredisMajor: 5 },
    },
    {
      ...base,
      displayName: 'ioredis6',
      roots: ['<rootDir>/test'],
      testMatch: secondIoredisFiles.map((file) => `<rootDir>/${file}`),
      // Everything that loads 'ioredis' gets ioredis 6 (the `ioredis6` npm alias): the tests' own
      // clients, and the backend's, which it requires through lib/peer-require.cts.
      moduleNameMapper: { '^ioredis(/.*)?$': '<rootDir>/node_modules/ioredis6$1', ...base.moduleNameMapper },
      globals: { expectedIoredisMajor: 6 },
    },
    {
      ...base,
      displayName: 'consumers',
      roots: ['<rootDir>/test/consumers'],
      testMatch: ['**/*.spec.ts'],
      // Packs the package once for every consumer app (they install it from the tarball).
      globalSetup: '<rootDir>/test/consumers/pack.mjs',
      globalTeardown: '<rootDir>/test/consumers/unpack.mjs',
    },
  ],
};
