/**
 * Redis refusals by the user's ACL. Redis words them differently by where the command ran and by
 * version: `NOPERM ...` for a command sent directly; from inside a script, Redis 7.0 says
 * `The user executing the script can't ...` and 7.2 on `ACL failure in script: ...`.
 */
const ACL_DENIAL = /NOPERM|ACL failure|The user executing the script can't/;

/** Whether `error` is Redis refusing a command, key or channel to this user. */
export function isAclDenial(error: unknown): boolean {
  return ACL_DENIAL.test(error instanceof Error ? error.message : String(error));
}

/** Where the rule that allows everything the library sends is written down. */
export const ACL_RULE_DOCS = `"Least privilege and TLS" in the Redis backend's docs (docs/redis.md) gives the whole rule`;
