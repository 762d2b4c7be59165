/** Injection token of the options given to forRoot / returned by forRootAsync's factory. */
export const DISTRIBUTED_LOCK_OPTIONS = Symbol('DISTRIBUTED_LOCK_OPTIONS');
