/**
 * What the create form asks and the link it makes, without a DOM. The fields, their defaults and
 * rules come from the job's schema (src/jobs/train_config.ts), their labels and hints from
 * train_form_labels.ts, and a form is checked by the same parser the page runs on the link, so
 * the form cannot accept a value the page would refuse, nor refuse one it would accept.
 */
import { SESSION_NAME } from '../../src/wire/protocol.ts';
import { isLoopbackHost, type ServerInfo } from './server_info.ts';
import {
  ConfigError,
  LOCAL_DATA_OPTION_NAMES,
  TRAIN_OPTIONS,
  configParams,
  parseOption,
  parseTrainConfig,
  type OptionSpec,
  type TrainConfig,
  type TrainOptionName,
} from '../../src/jobs/train_config.ts';
import { FORM_DEFAULTS, TRAIN_FORM_LABELS } from './train_form_labels.ts';

/** The form's text by field name, as typed (trimmed). A missing name counts as empty. */
export type FormValues = Readonly<Record<string, string>>;

export type FieldControl =
  /** `labels`: the words shown for each choice, in the same order (the choices themselves when left out). */
  | { type: 'select'; choices: readonly string[]; labels?: readonly string[] }
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
      return kind.presets ? { type: 'select', choices: kind.presets } : { type: 'text' };
  }
}

/** The field's control, with the select's words for its choices where the labels give them. */
function fieldControl(spec: OptionSpec<TrainOptionName>): FieldControl {
  const control = controlOf(spec.kind);
  const words = TRAIN_FORM_LABELS[spec.name].choiceLabels;
  if (control.type !== 'select' || !words) return control;
  return { ...control, labels: control.choices.map((c) => words[c] ?? c) };
}

/** The form's fields in order: the session name, then each schema option shown in the form. */
export const FORM_FIELDS: readonly FormField[] = [
  SESSION_FIELD,
  ...FORM_OPTIONS.map((spec) => ({
    name: spec.name,
    label: TRAIN_FORM_LABELS[spec.name].label,
    hint: TRAIN_FORM_LABELS[spec.name].hint,
    control: fieldControl(spec),
    optional: spec.optional === true,
  })),
];

/**
 * What each option's field holds until the person types their own: the schema's default given
 * the fields before it (so the learning rate follows the optimizer), or its form default (the
 * minimum starts at 1: sessions made here are elastic). Optional fields hold nothing: empty
 * means "not set".
 */
export function fieldDefaults(values: FormValues): Record<string, string> {
  const parsed: Record<string, unknown> = {};
  const out: Record<string, string> = {};
  for (const spec of TRAIN_OPTIONS) {
    const fallback = spec.defaultValue(parsed);
    const shown = Object.hasOwn(FORM_DEFAULTS, spec.name) ? FORM_DEFAULTS[spec.name] : fallback;
    if (spec.inForm) out[spec.name] = spec.optional === true || shown === null || shown === undefined ? '' : String(shown);
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

/**
 * Whether a field is shown and read: the classes and pictures' size and colour only for
 * dataset local (each tab's own pictures); every other field always.
 */
export function fieldApplies(name: string, values: FormValues): boolean {
  return !LOCAL_DATA_OPTION_NAMES.includes(name) || values.dataset === 'local';
}

/** The job the form describes; throws ConfigError, as the page would on the same link. */
export function formConfig(values: FormValues): TrainConfig {
  const inForm = new Set<string>(FORM_OPTIONS.map((o) => o.name));
  // A hidden field's leftover text (classes typed, then another dataset chosen) is not part of the job.
  return parseTrainConfig((name) => (inForm.has(name) ? (fieldApplies(name, values) ? (values[name] ?? '') : '') : null));
}

/** A message for each field that is wrong; an empty object when the form is good. */
export function checkForm(values: FormValues): Record<string, string> {
  const errors: Record<string, string> = {};
  const session = values.session ?? '';
  if (session === '') errors.session = 'Session name is required.';
  else if (!SESSION_NAME.test(session)) errors.session = 'Use only letters, digits, “-”, “_” and “.” (at most 64 characters).';
  for (const spec of FORM_OPTIONS) {
    if (!fieldApplies(spec.name, values)) continue;
    const raw = values[spec.name] ?? '';
    if (raw === '') {
      if (!spec.optional) errors[spec.name] = `${fieldName(TRAIN_FORM_LABELS[spec.name].label)} is required.`;
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
 * in the fragment (`#token=...`, never sent to the server). With `hostSecret`, the creator's own
 * link: `#token=T&host=H` lets that tab stop or end the session for everyone; the link shared
 * with others has the token only. Throws ConfigError when a value breaks its rule (checkForm
 * says which, for a person).
 */
export function sessionUrl(origin: string, values: FormValues, token: string, hostSecret?: string): string {
  const config = formConfig(values);
  const p = new URLSearchParams();
  p.set('session', values.session ?? '');
  p.set('world', String(config.max));
  p.set('job', 'train');
  for (const [name, value] of configParams(config)) if (name !== 'world') p.set(name, value);
  const url = new URL(`${origin.replace(/\/+$/, '')}/?${p.toString()}`);
  url.hash = new URLSearchParams(hostSecret === undefined ? { token } : { token, host: hostSecret }).toString();
  return url.toString();
}

/**
 * A link that is safe to pass on: without the host's secret (`host` in the fragment) and without
 * a `rank` (each tab gets its own).
 */
export function shareableUrl(link: string): string {
  const url = new URL(link);
  url.searchParams.delete('rank');
  const fragment = new URLSearchParams(url.hash.replace(/^#/, ''));
  fragment.delete('host');
  url.hash = fragment.toString();
  return url.toString();
}

/** The same link from another address (an origin other machines can reach). */
export function withOrigin(link: string, origin: string): string {
  const url = new URL(link);
  const base = new URL(origin);
  url.protocol = base.protocol;
  url.host = base.host;
  return url.toString();
}

/**
 * One sentence under the minimum: what the numbers typed mean when tabs close, reload or join.
 * Falls back to the schema's hint while the numbers are not valid yet.
 */
export function minNote(values: FormValues): string {
  const world = Number(values.world);
  const min = Number(values.min);
  const valid = Number.isSafeInteger(world) && Number.isSafeInteger(min) && min >= 1 && world >= 1 && min <= world;
  if (!valid) return TRAIN_FORM_LABELS.min.hint ?? '';
  if (min < world) {
    return `Tabs may close, reload or join while it runs: training goes on while at least ${min} ${min === 1 ? 'is' : 'are'} in, whereas a fixed size (${world} here) would pause whenever one leaves.`;
  }
  if (world === 1)
    return 'One tab trains alone; with a larger world size, tabs may close, reload or join while training goes on with at least this many.';
  return `A fixed size: training pauses whenever one of the ${world} tabs leaves, until one is back; a lower minimum keeps training while tabs close, reload or join.`;
}

/**
 * "Quick demo": a run of about half a minute on the built-in synthetic data, to see the
 * dashboard work before a real run (the learning rate follows the optimizer as usual).
 */
/** A short run for three tabs that starts once two have joined: every tab opened on its link trains. */
export const DEMO_PRESET: FormValues = {
  world: '3',
  min: '2',
  model: 'mlp',
  dataset: 'synthetic',
  batchSize: '32',
  epochs: '1',
  steps: '60',
  trainSize: '2048',
};

/** "Steps (optional)" -> "Steps": the label as the subject of a sentence. */
function fieldName(label: string): string {
  return label.replace(/\s*\(optional\)$/, '');
}

function ruleMessage(spec: OptionSpec<TrainOptionName>, err: unknown): string {
  if (!(err instanceof ConfigError)) throw err;
  return `${fieldName(TRAIN_FORM_LABELS[spec.name].label)} must be ${err.rule}.`;
}

/** Whether other machines can open `url`, and what to do when they cannot. */
export function reachNote(url: string, server: ServerInfo | null): string {
  const u = new URL(url);
  if (isLoopbackHost(u.hostname)) {
    const why = server ? `the server listens on ${server.listening} only` : `${u.hostname} is this computer's own address`;
    return `Only this computer can open this link: ${why}. To let other machines in, restart the server with HOST=0.0.0.0 npm start and create the session again.`;
  }
  if (u.protocol === 'http:') {
    return 'Other computers open this over plain http, where browsers offer no WebGPU: their tabs train on WebGL or the CPU instead, and say so. For WebGPU, restart the server with npm start -- --https.';
  }
  if (server?.certificate?.selfSigned) {
    return `The server's certificate is self-signed: other computers' browsers warn about it the first time. Check that the SHA-256 fingerprint the warning page's certificate shows is ${server.certificate.fingerprint256}, then proceed (or import the server's certs/cert.pem as trusted).`;
  }
  return '';
}
