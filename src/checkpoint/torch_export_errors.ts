/**
 * What the PyTorch export (torch_export.ts) refuses, and the check of every name from a file
 * before it reaches the Python file.
 */

/** A layer the export cannot map onto torch: which layer, and why. */
export class TorchExportError extends Error {
  override name = 'TorchExportError';
  constructor(
    /** The TF.js layer's name, when the problem is one layer's. */
    readonly layer: string | undefined,
    readonly reason: string,
  ) {
    super(layer === undefined ? `cannot export to PyTorch: ${reason}` : `cannot export layer "${layer}" to PyTorch: ${reason}`);
  }
}

/**
 * TF.js's own pattern for tensor names (tfjs-layers' `isValidTensorName`); layer names are the
 * first part of their weights' names, so they must match it too. Nothing outside it reaches the
 * Python file: a name is data there, and a newline in one would be code.
 */
export const TFJS_NAME_PATTERN = /^[A-Za-z0-9][-A-Za-z0-9._/]*$/;

/** A layer or weight name outside `TFJS_NAME_PATTERN`: which name, which kind, which file. */
export class TorchExportNameError extends TorchExportError {
  override name = 'TorchExportNameError';
  readonly pattern = TFJS_NAME_PATTERN;
  constructor(
    readonly kind: 'layer' | 'weight',
    /** The refused name, as the file holds it. */
    readonly invalidName: unknown,
    /** The options' `source` (the file the model came from), when given. */
    readonly file: string | undefined,
  ) {
    // JSON: the message shows control characters escaped, on one line, and a long name cut.
    super(
      undefined,
      `the ${kind} name ${shown(invalidName)}${file === undefined ? '' : ` in ${shown(file)}`} is not a valid TF.js name (${String(TFJS_NAME_PATTERN)}: a letter or digit, then letters, digits, - . _ /)`,
    );
  }
}

export function shown(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 200 ? `${s.slice(0, 200)}...` : s;
}

export function checkName(kind: 'layer' | 'weight', name: unknown, file: string | undefined): string {
  if (typeof name !== 'string' || !TFJS_NAME_PATTERN.test(name)) throw new TorchExportNameError(kind, name, file);
  return name;
}
