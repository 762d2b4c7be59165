import { randomFillSync } from 'node:crypto';

const TOKEN_BYTES = 16;
/** Tokens per system call for random bytes: randomBytes(16) per acquisition was most of its CPU time. */
const POOL_TOKENS = 256;
/**
 * Tokens per hex encoding: encoding each token on its own was 7% of an in-memory acquire+release.
 * Each token is a slice of the chunk's text and keeps it alive (V8 shares the characters), so a
 * chunk stays small: a long-held lock keeps 512 characters, not the pool's 8 192.
 */
const CHUNK_TOKENS = 16;
const pool = Buffer.allocUnsafe(TOKEN_BYTES * POOL_TOKENS);
let poolOffset = pool.length;
let chunk = '';
let chunkOffset = 0;

/** A fresh random 128-bit owner token, as 32 hex characters. */
export function newOwnerToken(): string {
  if (chunkOffset === chunk.length) {
    if (poolOffset === pool.length) {
      randomFillSync(pool);
      poolOffset = 0;
    }
    chunk = pool.toString('hex', poolOffset, poolOffset + TOKEN_BYTES * CHUNK_TOKENS);
    poolOffset += TOKEN_BYTES * CHUNK_TOKENS;
    chunkOffset = 0;
  }
  const token = chunk.slice(chunkOffset, chunkOffset + TOKEN_BYTES * 2);
  chunkOffset += TOKEN_BYTES * 2;
  return token;
}
