/**
 * What the create form asks and the link it makes, without a DOM. The fields, their labels,
 * hints, defaults and rules come from the job's schema (client/train/config.ts), and a form is
 * checked by the same parser the page runs on the link, so the form cannot accept a value the
 * page would refuse, nor refuse one it would accept.
 */
import { SESSION_NAME } from '../../src/protocol.ts';
import { withToken } from '../../src/session_token.ts';
import { ConfigError, TRAIN_OPTIONS, configParams, parseOption, parseTrainConfig, type OptionSpec, type TrainConfig } from '../train/config.ts';

/** The form's text by field name, as typed (trimmed). A missing name counts as empty. */
export type FormValues = Readonly<Record<string, string>>;

export type FieldControl =
  | { type: 'select'; choices: readonly string[] }
  | { type: 'number'; min: number; max: number }
  /** Decimal numbers are typed as text: a number input would turn "1e-3" or "0,001" into nothing. */
  | { type: 'text'; inputmode?: 'decimal' };

export interface FormField {
  name: string;
  label: string;
  hint?: string;
  control: FieldControl;
  /** May be left empty ("not set"); the link then leaves it out. */
  optional: boolean;
}

/** The session's name: the form's own field, not a job option. */
const SESSION_FIELD: FormField = {
  name: 'session',
  label: 'Session name',
  hint: 'Letters, digits, “-”, “_” and “.”; up to 64 characters. Everyone who opens the link joins this session.',
  control: { type: 'text' },
  optional: false,
};

const FORM_OPTIONS = TRAIN_OPTIONS.filter((o) => o.inForm);

function controlOf(kind: OptionSpec['kind']): FieldControl {
  switch (kind.type) {
    case 'choice':
      return { type: 'select', choices: kind.choices };
    case 'bool':
      return { type: 'select', choices: ['true', 'false'] };
    case 'int':
      return { type: 'number', min: kind.min, max: kind.max };
    case 'number':
      return { type: 'text', inputmode: 'decimal' };
    case 'text':
      return { type: 'text' };
  }
}

/** The form's fields in order: the session name, then each schema option shown in the form. */
export const FORM_FIELDS: readonly FormField[] = [
  SESSION_FIELD,
  ...FORM_OPTIONS.map((spec) => ({ name: spec.name, label: spec.label, hint: spec.hint, control: controlOf(spec.kind), optional: spec.optional === true })),
];

/**
 * What each option's field holds until the person types their own: the schema's default given
 * the fields before it (so the learning rate follows the optimizer). Optional fields hold
 * nothing: empty means "not set".
 */
export function fieldDefaults(values: FormValues): Record<string, string> {
  const parsed: Record<string, unknown> = {};
  const out: Record<string, string> = {};
  for (const spec of TRAIN_OPTIONS) {
    const fallback = spec.defaultValue(parsed);
    if (spec.inForm) out[spec.name] = spec.optional === true || fallback === null || fallback === undefined ? '' : String(fallback);
    parsed[spec.name] = fallback;
    const raw = spec.inForm ? (values[spec.name] ?? '') : '';
    if (raw === '') continue;
    try {
      parsed[spec.name] = parseOption(spec, raw);
    } catch {
      // A value that breaks its rule is flagged on submit; fields after it follow the default.
    }
  }
  return out;
}

/** The job the form describes; throws ConfigError, as the page would on the same link. */
export function formConfig(values: FormValues): TrainConfig {
  const inForm = new Set(FORM_OPTIONS.map((o) => o.name));
  return parseTrainConfig((name) => (inForm.has(name) ? (values[name] ?? '') : null));
}

/** A message for each field that is wrong; an empty object when the form is good. */
export function checkForm(values: FormValues): Record<string, string> {
  const errors: Record<string, string> = {};
  const session = values.session ?? '';
  if (session === '') errors.session = 'Session name is required.';
  else if (!SESSION_NAME.test(session)) errors.session = 'Use only letters, digits, “-”, “_” and “.” (at most 64 characters).';
  for (const spec of FORM_OPTIONS) {
    const raw = values[spec.name] ?? '';
    if (raw === '') {
      if (!spec.optional) errors[spec.name] = `${fieldName(spec.label)} is required.`;
      continue;
    }
    try {
      parseOption(spec, raw);
    } catch (err) {
      errors[spec.name] = ruleMessage(spec, err);
    }
  }
  if (Object.keys(errors).length > 0) return errors;
  // Each value is good on its own; the parser also checks them against each other (min <= max).
  try {
    formConfig(values);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    // Options outside the form take their defaults; max, the one that can clash, is the world size.
    const spec = FORM_OPTIONS.find((o) => o.name === err.option) ?? FORM_OPTIONS.find((o) => o.name === 'world');
    if (!spec) throw err;
    errors[spec.name] = ruleMessage(spec, err);
  }
  return errors;
}

/**
 * The link every tab of the session opens: `session`, `world` and `job` first (the documented
 * order), then the job's options as the page's parser reads them back, and the session's secret
 * in the fragment (`#token=...`, never sent to the server). Throws ConfigError when a value breaks
 * its rule (checkForm says which, for a person).
 */
export function sessionUrl(origin: string, values: FormValues, token: string): string {
  const config = formConfig(values);
  const p = new URLSearchParams();
  p.set('session', values.session ?? '');
  p.set('world', String(config.max));
  p.set('job', 'train');
  for (const [name, value] of configParams(config)) if (name !== 'world') p.set(name, value);
  return withToken(`${origin.replace(/\/+$/, '')}/?${p.toString()}`, token);
}

/** "Steps (optional)" -> "Steps": the label as the subject of a sentence. */
function fieldName(label: string): string {
  return label.replace(/\s*\(optional\)$/, '');
}

function ruleMessage(spec: OptionSpec, err: unknown): string {
  if (!(err instanceof ConfigError)) throw err;
  return `${fieldName(spec.label)} must be ${err.rule}.`;
}
