/**
 * One job option's rule and how its text is read: the kinds of value an option takes, the error
 * that names a value breaking its rule, and the parse of one URL parameter or form field. The
 * train job's schema (train_config.ts) is a list of these; labels and hints are the page's
 * (client/ui/train_form_labels.ts).
 */

/** What an option's value may be. */
export type OptionKind =
  | { type: 'int'; min: number; max: number }
  | { type: 'number'; min: number; max: number }
  | { type: 'choice'; choices: readonly string[] }
  | { type: 'bool' }
  /** `presets`: values a form offers as a select (any value the pattern and the parser take is still valid in a link). */
  | { type: 'text'; pattern: RegExp; rule: string; presets?: readonly string[] };

export interface OptionSpec<N extends string = string> {
  /** The URL parameter (camelCase; the kebab-case spelling is accepted too). */
  name: N;
  kind: OptionKind;
  /** Shown in the create form (a link then always carries it, default or not, unless optional). */
  inForm: boolean;
  /** May be left empty ("not set": every tab, whole epochs, the whole training set); a link then leaves it out. */
  optional?: boolean;
  /** The value when the URL leaves it out; null means "not set". */
  defaultValue(partial: Partial<Record<string, unknown>>): unknown;
}

/** A URL or form value that breaks an option's rule; the message says which and what is allowed. */
export class ConfigError extends Error {
  override name = 'ConfigError';
  constructor(
    readonly option: string,
    readonly value: string,
    readonly rule: string,
  ) {
    super(`option ${option} must be ${rule}, got "${value}"`);
  }
}

/** What an option allows, in words ("an integer from 1 to 64"). */
export function describeRule(kind: OptionKind): string {
  switch (kind.type) {
    case 'int':
      return kind.min <= Number.MIN_SAFE_INTEGER ? 'an integer' : `an integer from ${kind.min} to ${kind.max}`;
    case 'number':
      return `a number above 0 and at most ${kind.max}`;
    case 'choice':
      return `one of ${kind.choices.join(', ')}`;
    case 'bool':
      return 'true or false';
    case 'text':
      return kind.rule;
  }
}

/** Parses one option's text; throws ConfigError. An empty string means "not set". */
export function parseOption(spec: OptionSpec, raw: string): unknown {
  const k = spec.kind;
  const bad = () => new ConfigError(spec.name, raw, describeRule(k));
  switch (k.type) {
    case 'int':
    case 'number': {
      const n = Number(raw.trim());
      if (raw.trim() === '' || !Number.isFinite(n) || n < k.min || n > k.max || (k.type === 'int' && !Number.isSafeInteger(n))) throw bad();
      return n;
    }
    case 'choice':
      if (!k.choices.includes(raw)) throw bad();
      return raw;
    case 'bool':
      if (raw !== 'true' && raw !== 'false') throw bad();
      return raw === 'true';
    case 'text':
      if (!k.pattern.test(raw)) throw bad();
      return raw;
  }
}

/** An option's kebab-case spelling (batchSize: batch-size), which links and the launcher's flags may use: the one conversion. */
export function kebabCase(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
}

/** Reads a parameter in camelCase or kebab-case (batchSize, batch-size). */
export function urlOption(params: URLSearchParams, name: string): string | null {
  return params.get(name) ?? params.get(kebabCase(name));
}
