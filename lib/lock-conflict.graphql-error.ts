import { IntrinsicException } from '@nestjs/common';
import type { LockConflictBody } from './lock.interceptor.js';

/** The `extensions.code` a GraphQL client sees for a busy lock. */
export const LOCK_CONFLICT_CODE = 'LOCK_CONFLICT';

/**
 * A busy lock under a GraphQL resolver. GraphQL servers copy an error's `extensions` into the
 * response (graphql-js takes them from the error a resolver threw), so the client gets
 * `extensions.code: 'LOCK_CONFLICT'` with the conflict body's fields. A ConflictException would
 * not do: Nest's Apollo driver turns every HTTP status it has no GraphQL code for, 409 among
 * them, into INTERNAL_SERVER_ERROR. No `graphql` import: it stays an optional dependency of apps
 * that use GraphQL. An IntrinsicException, so that Nest does not log it as the app's failure.
 */
export class LockConflictGraphQLError extends IntrinsicException {
  readonly extensions: { code: typeof LOCK_CONFLICT_CODE } & Omit<LockConflictBody, 'message'>;

  constructor(body: LockConflictBody, options?: { cause?: unknown }) {
    super(body.message, options);
    this.name = 'LockConflictGraphQLError';
    const { message: _message, ...rest } = body;
    this.extensions = { code: LOCK_CONFLICT_CODE, ...rest };
  }
}
