import { BadRequestException, Injectable, type PipeTransform } from '@nestjs/common';

/**
 * Control characters (C0, DEL, C1: NUL, tabs, line breaks, terminal escapes) and unpaired UTF-16
 * surrogates. PostgreSQL refuses NUL in text outright; the others it would store, and they would
 * then break the lines of logs, CSV exports and terminals that show the name. Format characters
 * (\p{Cf}) stay allowed: emoji sequences need their zero-width joiners.
 */
const NOT_TEXT = /\p{Cc}|\p{Cs}/u;

/** A product's name: one line of Unicode text, 1 to 200 characters once trimmed. */
@Injectable()
export class ProductNamePipe implements PipeTransform<unknown, string> {
  transform(value: unknown): string {
    if (typeof value !== 'string' || value.trim() === '' || value.length > 200) {
      throw invalidName('name must be a non-empty string of at most 200 characters.');
    }
    const found = NOT_TEXT.exec(value);
    if (found) {
      const codePoint = `U+${found[0].charCodeAt(0).toString(16).toUpperCase().padStart(4, '0')}`;
      throw invalidName(
        /\p{Cs}/u.test(found[0])
          ? `name must be valid Unicode text; found an unpaired surrogate ${codePoint} at position ${found.index + 1}.`
          : `name must not contain control characters (line breaks, tabs, NUL, ...); found ${codePoint} at position ${found.index + 1}.`,
      );
    }
    return value.trim();
  }
}

function invalidName(message: string): BadRequestException {
  return new BadRequestException({ statusCode: 400, error: 'Bad Request', message });
}
