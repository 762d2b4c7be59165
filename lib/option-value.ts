/**
 * A value as an error message shows it, for module and backend options alike: strings quoted (a
 * connection string's password masked), no object's content.
 */
export function show(value: unknown): string {
  if (typeof value === 'string') return `'${redactUrl(value)}'`;
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object' && value !== null) return 'an object';
  return String(value);
}

/**
 * A connection string fit for a message or a log: its password masked, whether it sits in the user
 * info or in a `password` parameter (which ioredis honours), and whether or not the string parses.
 */
export function redactUrl(text: string): string {
  return text.replace(/(\/\/[^/@]*?:)[^/@]*@/, '$1***@').replace(/([?&]password=)[^&#]*/gi, '$1***');
}
