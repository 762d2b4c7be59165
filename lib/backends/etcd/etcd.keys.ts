/**
 * Where the lock entries live: `<prefix><key>/<owner>`, one per key of an acquisition. A key's
 * line is every entry under `<prefix><key>/`, ordered by create revision. `/` and `%` in a key or
 * an owner are percent-encoded, so that the line of `a` never holds the entries of `a/b`.
 *
 * Beside each entry, who asks (etcd.identity.ts): `<prefix>%who/<key>/<owner>`. In an encoded
 * segment `%` is never followed by a letter, so no line holds those keys, nor the anchors:
 * processes of a release before them read lines as ranges, and see neither.
 */
export class EtcdKeys {
  /**
   * The range of the backend's own keys beside the lines (anchors, identity keys): their names
   * start with `%` and a letter, where an encoded key starts with `%25` or `%2F` if with `%` at all,
   * so no line's entry falls in `[<prefix>%3, <prefix>&)`, and every key of the backend's own does.
   */
  readonly own: { key: Buffer; range_end: Buffer };

  constructor(readonly prefix: string) {
    this.own = { key: Buffer.from(`${prefix}%3`), range_end: Buffer.from(`${prefix}&`) };
  }

  /** The entry of `owner` in the line of `key`. */
  entry(key: string, owner: string): Buffer {
    return Buffer.from(`${this.prefix}${encode(key)}/${encode(owner)}`);
  }

  /** The line of `key`, as a range [start, end) of etcd keys. */
  line(key: string): { key: Buffer; range_end: Buffer } {
    const base = `${this.prefix}${encode(key)}`;
    // '0' is the byte after '/': the range holds exactly the keys that start with `<base>/`.
    return { key: Buffer.from(`${base}/`), range_end: Buffer.from(`${base}0`) };
  }

  /** Who `owner` is, beside its entry in the line of `key`. */
  identity(key: string, owner: string): Buffer {
    return Buffer.from(`${this.prefix}${WHO}${encode(key)}/${encode(owner)}`);
  }

  /** Who is in the line of `key`, as a range of etcd keys, in owner order (not line order). */
  identities(key: string): { key: Buffer; range_end: Buffer } {
    const base = `${this.prefix}${WHO}${encode(key)}`;
    return { key: Buffer.from(`${base}/`), range_end: Buffer.from(`${base}0`) };
  }

  /** The identity key beside an entry read off a line (another owner's, as read). */
  identityOf(entry: Buffer): Buffer {
    return Buffer.concat([Buffer.from(`${this.prefix}${WHO}`), entry.subarray(Buffer.byteLength(this.prefix))]);
  }

  /**
   * The anchor of `owner`'s attempt to stand in line, a key on the lease the attempt would hold
   * its keys on. `%` never starts an encoded segment, so no line holds it.
   */
  anchor(owner: string): Buffer {
    return Buffer.from(`${this.prefix}%anchor/${encode(owner)}`);
  }

  /** The owner an entry of the line of `key` belongs to. */
  ownerOf(entry: Buffer): string {
    const text = entry.toString();
    return decodeURIComponent(text.slice(text.lastIndexOf('/') + 1));
  }
}

/** The folder of the identity keys, under the prefix. */
const WHO = '%who/';

export function encode(segment: string): string {
  return segment.replace(/%/g, '%25').replace(/\//g, '%2F');
}
