/** Tabular datasets from CSV text: numeric features and a label column. */
import { DatasetError, InMemoryDataset } from './dataset.ts';

export interface CsvDatasetOptions {
  /** Header name, or 0-based column index (negative counts from the end: -1 is the last column). */
  labelColumn: string | number;
  name?: string;
  /** Whether the first row names the columns. Default true. */
  hasHeader?: boolean;
  /**
   * Fixes the class-name-to-id mapping (id = position in this list), e.g. pass a training set's
   * `classNames` when loading its test set, whose sorted names might lack a class.
   */
  classNames?: readonly string[];
  /** For integer labels: the class count, when the file may not contain the highest class. */
  numClasses?: number;
}

/**
 * A tabular dataset from CSV text: comma-separated, optionally double-quoted fields ("" escapes a
 * quote), \n or \r\n line ends, blank lines skipped. Every column except the label is a numeric
 * feature; inputShape is [columns - 1].
 *
 * Labels that are all non-negative integers are used as class ids (numClasses = max + 1).
 * Otherwise they are class names, mapped to ids in sorted order (plain code-unit order, the same
 * on every platform) and exposed as `classNames`.
 */
export function csvDataset(text: string, options: CsvDatasetOptions): InMemoryDataset {
  const name = options.name ?? 'csv';
  const hasHeader = options.hasHeader ?? true;
  const records = parseCsv(text, name);
  const header = hasHeader ? records.shift() : undefined;
  const width = header?.fields.length ?? records[0]?.fields.length;
  if (width === undefined) throw new DatasetError(`${name}: the CSV has no rows`);
  const columnName = (c: number): string => (header ? ` "${header.fields[c]}"` : '');
  const labelColumn = resolveLabelColumn(name, options.labelColumn, width, header?.fields);
  if (width < 2) throw new DatasetError(`${name}: need at least one feature column besides the label`);
  if (records.length === 0) throw new DatasetError(`${name}: the CSV has a header but no data rows`);

  const features = width - 1;
  const inputs = new Float32Array(records.length * features);
  const rawLabels: string[] = [];
  records.forEach((record, r) => {
    const where = `row ${r + 1} (line ${record.line})`;
    if (record.fields.length !== width) {
      throw new DatasetError(
        `${name}: ${where} has ${record.fields.length} fields, expected ${width}${header ? ' like the header' : ' like the first row'}`,
      );
    }
    let f = r * features;
    for (let c = 0; c < width; c++) {
      const field = record.fields[c]!;
      if (c === labelColumn) {
        if (field === '') throw new DatasetError(`${name}: ${where}, column ${c + 1}${columnName(c)}: empty label`);
        rawLabels.push(field);
        continue;
      }
      if (!NUMBER.test(field)) {
        const shown = field === '' ? 'empty value' : `"${field}" is not a number`;
        throw new DatasetError(`${name}: ${where}, column ${c + 1}${columnName(c)}: ${shown}`);
      }
      inputs[f++] = Number(field);
    }
  });

  const labelWhere = `label column ${labelColumn + 1}${columnName(labelColumn)}`;
  const { labels, numClasses, classNames } = encodeLabels(name, labelWhere, rawLabels, records, options);
  return new InMemoryDataset({ name, inputs, labels, inputShape: [features], numClasses, classNames });
}

/** Plain decimal numbers only: Number() alone would also accept '', ' ', '0x1f' and 'Infinity'. */
const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
const CLASS_ID = /^\d+$/;

function resolveLabelColumn(name: string, labelColumn: string | number, width: number, headerFields: string[] | undefined): number {
  if (typeof labelColumn === 'string') {
    if (!headerFields) throw new DatasetError(`${name}: labelColumn "${labelColumn}" is a name, but hasHeader is false`);
    const c = headerFields.indexOf(labelColumn);
    if (c < 0) {
      throw new DatasetError(
        `${name}: label column "${labelColumn}" not found; the columns are ${headerFields.map((h) => `"${h}"`).join(', ')}`,
      );
    }
    return c;
  }
  const c = labelColumn < 0 ? width + labelColumn : labelColumn;
  if (!Number.isInteger(labelColumn) || c < 0 || c >= width) {
    throw new DatasetError(`${name}: label column ${labelColumn} does not exist; rows have ${width} columns`);
  }
  return c;
}

function encodeLabels(
  name: string,
  labelWhere: string,
  raw: string[],
  records: CsvRecord[],
  options: CsvDatasetOptions,
): { labels: Int32Array; numClasses: number; classNames?: readonly string[] } {
  const labels = new Int32Array(raw.length);
  const where = (r: number): string => `${name}: row ${r + 1} (line ${records[r]!.line}), ${labelWhere}`;

  if (options.classNames === undefined && raw.every((v) => CLASS_ID.test(v))) {
    let max = -1;
    raw.forEach((v, r) => {
      const id = Number(v);
      if (id > 0x7fffffff) throw new DatasetError(`${where(r)}: class id ${v} is too large`);
      labels[r] = id;
      max = Math.max(max, id);
    });
    const numClasses = options.numClasses ?? max + 1;
    if (numClasses <= max) {
      throw new DatasetError(`${name}: numClasses ${numClasses} is too small for class id ${max} in the ${labelWhere}`);
    }
    return { labels, numClasses };
  }

  const classNames = options.classNames ?? [...new Set(raw)].sort();
  if (options.numClasses !== undefined && options.numClasses !== classNames.length) {
    throw new DatasetError(`${name}: numClasses ${options.numClasses} given, but there are ${classNames.length} class names`);
  }
  const ids = new Map(classNames.map((c, i) => [c, i] as const));
  raw.forEach((v, r) => {
    const id = ids.get(v);
    if (id === undefined) throw new DatasetError(`${where(r)}: "${v}" is not one of the given classNames`);
    labels[r] = id;
  });
  return { labels, numClasses: classNames.length, classNames };
}

interface CsvRecord {
  fields: string[];
  /** 1-based line where the record starts. */
  line: number;
}

/** A small RFC 4180-style reader. Unquoted fields are trimmed; quoted fields are kept verbatim. */
function parseCsv(text: string, name: string): CsvRecord[] {
  const records: CsvRecord[] = [];
  const n = text.length;
  let i = text.charCodeAt(0) === 0xfeff ? 1 : 0; // Byte-order mark from spreadsheet exports.
  let line = 1;
  const isSpace = (ch: string | undefined): boolean => ch === ' ' || ch === '\t';
  const isEnd = (ch: string | undefined): boolean => ch === undefined || ch === ',' || ch === '\n' || ch === '\r';

  while (i < n) {
    const startLine = line;
    const fields: string[] = [];
    let quotedAny = false;
    for (;;) {
      let j = i;
      while (isSpace(text[j])) j++;
      if (text[j] === '"') {
        quotedAny = true;
        const quoteLine = line;
        let value = '';
        i = j + 1;
        for (;;) {
          const q = text.indexOf('"', i);
          if (q < 0) throw new DatasetError(`${name}: unterminated quoted field starting on line ${quoteLine}`);
          const chunk = text.slice(i, q);
          value += chunk;
          line += countNewlines(chunk);
          if (text[q + 1] === '"') {
            value += '"';
            i = q + 2;
          } else {
            i = q + 1;
            break;
          }
        }
        while (isSpace(text[i])) i++;
        if (!isEnd(text[i])) {
          throw new DatasetError(`${name}: line ${line}, column ${fields.length + 1}: unexpected text after a closing quote`);
        }
        fields.push(value);
      } else {
        while (!isEnd(text[i])) i++;
        fields.push(text.slice(j, i).trim());
      }
      if (text[i] === ',') {
        i++;
        continue;
      }
      if (text[i] === '\r') i++;
      if (text[i] === '\n') i++;
      line++;
      break;
    }
    const blank = !quotedAny && fields.length === 1 && fields[0] === '';
    if (!blank) records.push({ fields, line: startLine });
  }
  return records;
}

function countNewlines(s: string): number {
  let count = 0;
  for (let k = s.indexOf('\n'); k >= 0; k = s.indexOf('\n', k + 1)) count++;
  return count;
}
