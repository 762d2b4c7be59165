import { describe, expect, it } from '@jest/globals';
import { newOwnerToken } from '../lib/owner-token.js';

describe('owner tokens', () => {
  it('are 128 random bits, distinct across pool refills', () => {
    const tokens = Array.from({ length: 2_000 }, newOwnerToken);
    expect(tokens.every((token) => /^[0-9a-f]{32}$/.test(token))).toBe(true);
    expect(new Set(tokens).size).toBe(tokens.length);
  });
});
