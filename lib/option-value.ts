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
 * The user info runs from after the scheme and its slashes (one, two, or none: 'user:pw@host') to
 * the LAST '@', since a password may hold '@' and '/' unencoded and parsers take the last one. Of
 * it only the user name before the first ':' is kept; without a ':' all of it is masked, as a lone
 * name may be a password.
 */
export function redactUrl(text: string): string {
  return text
    .replace(/^((?:[a-z][a-z0-9+.-]*:(?=\/))?\/*)([^]*)@/i, (_, start: string, userInfo: string) => {
      const colon = userInfo.indexOf(':');
      return `${start}${colon === -1 ? '' : userInfo.slice(0, colon + 1)}***@`;
    })
    .replace(/([?&]password=)[^&#]*/gi, '$1***');
}
