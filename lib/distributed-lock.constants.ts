/** Injection token of the options given to forRoot / returned by forRootAsync's factory. */
export const DISTRIBUTED_LOCK_OPTIONS = Symbol.for('nest-distributed-lock:DISTRIBUTED_LOCK_OPTIONS');
