import type { Cluster, Redis } from 'ioredis';
import { LockBackendError } from '../../lock.errors.js';
import { CommandDeadlines } from '../command-deadlines.js';
import { ACL_RULE_DOCS } from './redis.acl.js';
import { refusalFix, refusalOf } from './redis.refusals.js';
import type { RedisConnection } from './redis.connection.js';
import type { RedisScript } from './redis.script-prelude.js';
import { sentence } from '../backend-message.js';

class CommandTimeoutError extends Error {}

/** One script call: what it is for (for errors) and what it sends. */
export interface ScriptCall {
  /** The operation and the lock keys it is for, as error messages name them. */
  op: string;
  keys: readonly string[];
  script: RedisScript;
  redisKeys: readonly string[];
  args: readonly (string | number)[];
  /**
   * The answer that came after the call was reported as failed (timed out). What it returns (a
   * promise: the clean-up it starts) counts as part of the call, which close() waits for.
   */
  onLateAnswer?: (reply: unknown) => unknown;
  /** Sent in one write behind a PING (see RedisLockBackend.release). */
  behindPing?: boolean;
}

/**
 * Runs the Lua scripts of one backend: by SHA, and on NOSCRIPT (a restarted or flushed Redis) whole
 * once; each call bounded by commandTimeout, with failures turned into LockBackendError.
 */
export class RedisScriptRunner {
  private readonly deadlines: CommandDeadlines;

  constructor(
    private readonly connection: RedisConnection,
    private readonly backendName: string,
    private readonly commandTimeout: number,
  ) {
    this.deadlines = new CommandDeadlines(commandTimeout);
  }

  run(client: Redis | Cluster, call: ScriptCall): Promise<unknown> {
    const { script, redisKeys, args } = call;
    return new Promise((resolve, reject) => {
      const command = this.deadlines.track(() =>
        reject(
          this.failure(
            call,
            client,
            new CommandTimeoutError(`Redis did not answer within ${this.commandTimeout} ms (commandTimeout); is it paused or overloaded?`),
          ),
        ),
      );
      const answered = (reply: unknown): unknown => {
        this.connection.answered();
        if (this.deadlines.answered(command)) return resolve(reply);
        return call.onLateAnswer?.(reply);
      };
      const failed = (error: unknown) => {
        if (!this.deadlines.answered(command)) return;
        if (!isReadOnly(error)) return reject(this.failure(call, client, error, this.connection.readOnlyHeals));
        // A fresh connection tells a demoted master (heals) from a replica (for good).
        void this.connection
          .readOnlyForGood(client, this.commandTimeout)
          .then((forGood) => reject(this.failure(call, client, error, !forGood)));
      };
      const sent = call.behindPing
        ? (client as Redis)
            .pipeline()
            .ping()
            .evalsha(script.sha, redisKeys.length, ...redisKeys, ...args)
            .exec()
            .then((replies) => {
              const [error, reply] = replies![1];
              if (error) throw error;
              return reply;
            })
        : client.evalsha(script.sha, redisKeys.length, ...redisKeys, ...args);
      // Until its answer is handled, and what a late one starts: close() quits the client after.
      this.connection.track(
        sent.then(answered, (error: unknown) => {
          if (error instanceof Error && error.message.startsWith('NOSCRIPT')) {
            return client.eval(script.lua, redisKeys.length, ...redisKeys, ...args).then(answered, failed);
          }
          failed(error);
        }),
      );
    });
  }

  private failure(
    { op, keys, redisKeys }: ScriptCall,
    client: Redis | Cluster,
    error: unknown,
    readOnlyHeals = this.connection.readOnlyHeals,
  ): LockBackendError {
    // Refused for good while connecting (no such database, credentials): that is the news, not the
    // "Connection is closed" or "max retries" the call itself met.
    const refused = this.connection.refusal;
    if (refused) return refused;
    const refusal = refusalOf(error, readOnlyHeals);
    // ioredis's "max retries per request" names an option of a client the user may not have made:
    // the state of the connection, which follows, says what is wrong.
    const unsent = error instanceof Error && error.name === 'MaxRetriesPerRequestError' && client.status !== 'ready';
    const message = unsent ? 'not sent, as Redis could not be reached.' : sentence(error instanceof Error ? error.message : String(error));
    const advice =
      refusal === 'rights'
        ? aclAdvice(op, redisKeys, client)
        : refusal
          ? ` ${refusalFix(refusal, this.connection.where(client))}`
          : this.connection.describeState(client);
    // Waiting does not change a refusal: the caller fails at once (see LockBackendError.permanent).
    return new LockBackendError(this.backendName, `${op} of ${keys.join(', ')} failed: ${message}${advice}`, error, {
      permanent: refusal !== undefined,
    });
  }
}

/**
 * What the user's ACL must allow for this call. Redis says which command it refused, but not which
 * key: the keys are named as Redis sees them (the client's keyPrefix included), companions too.
 */
function aclAdvice(op: string, redisKeys: readonly string[], client: Redis | Cluster): string {
  const prefix = client.options.keyPrefix ?? '';
  const publish = op === 'release' ? ', and PUBLISH (SPUBLISH on Cluster) to the wake-up channel of the waiter it names' : '';
  return (
    ` The Redis user's ACL refused it: this call needs EVALSHA, EVAL and the commands of the lock scripts ` +
    `on the keys ${redisKeys.map((key) => prefix + key).join(', ')}${publish}. ${ACL_RULE_DOCS}.`
  );
}

function isReadOnly(error: unknown): boolean {
  return error instanceof Error && /\bREADONLY\b/.test(error.message);
}
