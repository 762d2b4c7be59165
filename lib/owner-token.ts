import { randomFillSync } from 'node:crypto';

const TOKEN_BYTES = 16;
const TOKENS = 256;
// One system call fills 256 tokens (randomBytes(16) per acquisition was most of its CPU time), and
// one hex encoding turns them into text: encoding each token on its own was 7% of an in-memory
// acquire+release.
const pool = Buffer.allocUnsafe(TOKEN_BYTES * TOKENS);
let hex = '';
let offset = 0;

/** A fresh random 128-bit owner token, as 32 hex characters. */
export function newOwnerToken(): string {
  if (offset === hex.length) {
    randomFillSync(pool);
    hex = pool.toString('hex');
    offset = 0;
  }
  const token = hex.slice(offset, offset + TOKEN_BYTES * 2);
  offset += TOKEN_BYTES * 2;
  return token;
}
