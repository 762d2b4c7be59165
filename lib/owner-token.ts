import { randomFillSync } from 'node:crypto';

const TOKEN_BYTES = 16;
// One system call fills 256 tokens: randomBytes(16) per acquisition was most of its CPU time.
const pool = Buffer.allocUnsafe(TOKEN_BYTES * 256);
let offset = pool.length;

/** A fresh random 128-bit owner token, as 32 hex characters. */
export function newOwnerToken(): string {
  if (offset === pool.length) {
    randomFillSync(pool);
    offset = 0;
  }
  const token = pool.toString('hex', offset, offset + TOKEN_BYTES);
  offset += TOKEN_BYTES;
  return token;
}
