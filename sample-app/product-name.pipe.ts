import { BadRequestException, Injectable, type PipeTransform } from '@nestjs/common';

@Injectable()
export class ProductNamePipe implements PipeTransform<unknown, string> {
  transform(value: unknown): string {
    if (typeof value !== 'string' || value.trim() === '' || value.length > 200) {
      throw new BadRequestException({
        statusCode: 400,
        error: 'Bad Request',
        message: `name must be a non-empty string of at most 200 characters.`,
      });
    }
    return value.trim();
  }
}
