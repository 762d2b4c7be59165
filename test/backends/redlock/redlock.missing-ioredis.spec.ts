import { describe, expect, it, jest } from '@jest/globals';
import { createRequire } from 'node:module';

// An app that installed redlock but not ioredis: the backend cannot open the URLs it was given.
const require = createRequire(import.meta.url);
jest.unstable_mockModule('../../../lib/peer-require.cjs', () => ({
  requirePeer: (name: string) => {
    if (name === 'ioredis') throw new Error("Cannot find module 'ioredis'");
    return require(name);
  },
}));
const { InvalidLockOptionsError, RedlockLockBackend } = await import('../../../lib/index.js');

describe('RedlockLockBackend without ioredis installed', () => {
  it('says what to install, and names the master without the password of its URL', () => {
    const urls = ['a', 'b', 'c'].map((host) => `redis://locks:s3cret@${host}:6379/0?password=s3cret`);
    const error = (() => {
      try {
        new RedlockLockBackend(urls);
      } catch (caught) {
        return caught as Error;
      }
    })();
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect(error!.message).toContain('npm install ioredis');
    expect(error!.message).toContain('redis://locks:***@a:6379/0?password=***');
    expect(error!.message).not.toContain('s3cret');
  });
});
