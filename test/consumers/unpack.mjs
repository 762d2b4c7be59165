// Jest globalTeardown of the consumer tests: removes what pack.mjs made.
import { rmSync } from 'node:fs';

export default function unpack() {
  if (process.env.NDL_PACK_DIR) rmSync(process.env.NDL_PACK_DIR, { recursive: true, force: true });
}
