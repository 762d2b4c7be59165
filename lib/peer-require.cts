// A .cts file compiles to CommonJS in the ESM build and in the CommonJS build alike, so this
// `require` is the package's own in both: it resolves the optional peers (ioredis, redlock) from
// where the package is installed, and needs no `import.meta`, which a CommonJS build cannot contain.
// Peers are loaded synchronously, when a backend is constructed, so a missing one stops the
// application at start-up with a message that says what to install.

/** `require(name)` from the package's own location. */
export function requirePeer(name: string): unknown {
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- the point of this file: CommonJS require, in both builds
  return require(name);
}
