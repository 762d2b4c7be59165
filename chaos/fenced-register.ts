import type { Redis } from 'ioredis';

/**
 * Reads or writes one register (a hash), refusing any call whose fencing token is below the
 * highest the register has seen: a read registers its token, so a holder that read before a newer
 * holder cannot write afterwards, and no write is lost. A write needs a token above the last
 * accepted write's, or that token from the same holder (a section writes several times under one
 * lock), and gets the register's next sequence number (its place in the register's own order).
 *
 * A shared holder (a reader beside others) reads with 'peek': refused only below the last accepted
 * write's token (readers hold together, so one with a lower token than another's is not stale),
 * and its token is seen from then on, so a writer whose lease ran out while readers came in cannot
 * write afterwards.
 *
 * KEYS[1] the register. ARGV: token ('' for an unfenced call), op ('read', 'peek' or 'write'), value, holder.
 * Result: {1, value} for a read, {1, seq} for an accepted write, {0, 0} when refused.
 * Tokens stay strings in the hash: Lua formats large numbers with 14 digits.
 */
const REGISTER_SCRIPT = `
local token, op, value, holder = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if token ~= '' then
  local seen = redis.call('HGET', KEYS[1], 'seen')
  local written = redis.call('HGET', KEYS[1], 'written')
  if op == 'peek' then
    if written and tonumber(token) < tonumber(written) then return {0, 0} end
    if not seen or tonumber(token) > tonumber(seen) then redis.call('HSET', KEYS[1], 'seen', token) end
    return {1, tonumber(redis.call('HGET', KEYS[1], 'value') or '0')}
  end
  if seen and tonumber(token) < tonumber(seen) then return {0, 0} end
  if op == 'write' and written then
    if tonumber(token) < tonumber(written) then return {0, 0} end
    if tonumber(token) == tonumber(written) and redis.call('HGET', KEYS[1], 'writer') ~= holder then return {0, 0} end
  end
  redis.call('HSET', KEYS[1], 'seen', token)
  if op == 'write' then redis.call('HSET', KEYS[1], 'written', token, 'writer', holder) end
end
if op == 'read' or op == 'peek' then return {1, tonumber(redis.call('HGET', KEYS[1], 'value') or '0')} end
redis.call('HSET', KEYS[1], 'value', value)
return {1, redis.call('HINCRBY', KEYS[1], 'seq', 1)}
`;

export class FencedRegister {
  constructor(private readonly client: Redis) {
    client.defineCommand('registerCall', { numberOfKeys: 1, lua: REGISTER_SCRIPT });
  }

  /** The value, or undefined when a newer token has been seen. */
  async read(key: string, token: number | undefined): Promise<number | undefined> {
    const [ok, value] = await this.call(key, token, 'read', '', '');
    return ok === 1 ? value : undefined;
  }

  /** A shared holder's read: the value, or undefined when a newer write has been accepted. */
  async peek(key: string, token: number | undefined): Promise<number | undefined> {
    const [ok, value] = await this.call(key, token, 'peek', '', '');
    return ok === 1 ? value : undefined;
  }

  /** The write's sequence number, or undefined when refused. */
  async write(key: string, token: number | undefined, value: number, holder: string): Promise<number | undefined> {
    const [ok, seq] = await this.call(key, token, 'write', String(value), holder);
    return ok === 1 ? seq : undefined;
  }

  private call(key: string, token: number | undefined, op: string, value: string, holder: string): Promise<[number, number]> {
    const client = this.client as unknown as { registerCall(key: string, ...args: string[]): Promise<[number, number]> };
    return client.registerCall(`register:${key}`, token === undefined ? '' : String(token), op, value, holder);
  }
}
