/** A driver's message as the end of one of our sentences: drivers' messages may end in '.' or '?' already (no 'cache..'). */
export function sentence(text: string): string {
  return /[.?!]$/.test(text) ? text : `${text}.`;
}
