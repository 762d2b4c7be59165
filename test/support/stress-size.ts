/**
 * Sections per caller of a stress test at full size: 200 (4 processes x 25 callers x 200 = 20 000
 * acquisitions), or STRESS_SECTIONS. CI runs the PostgreSQL, MariaDB and etcd stress tests side by
 * side on two cores with STRESS_SECTIONS=50: the same contention, a quarter of the length.
 */
export function fullStressSections(): number {
  const asked = Number(process.env.STRESS_SECTIONS ?? 200);
  if (!Number.isInteger(asked) || asked < 1)
    throw new Error(`STRESS_SECTIONS must be a positive integer, not ${process.env.STRESS_SECTIONS}`);
  return asked;
}
