// `nest-distributed-lock/testing`: helpers for testing an application's own locks, kept out of the
// main entry as @nestjs/testing is kept out of @nestjs/core. See docs/testing-your-app.md.
export { LockRecorder, recordLocks, type RecordedLockEvent } from './lock-recorder.js';
export { revokeLock } from './revoke-lock.js';
