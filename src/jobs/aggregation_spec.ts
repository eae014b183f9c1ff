/**
 * Robust aggregation and, for measuring it, attacks as the train job's options (the page's URL
 * parameters `aggregation`, `attack`, `attackers`; the launcher's --aggregation, --attack,
 * --attackers): their text both ways, and their bounds. Which strategies they combine with is
 * checked here too (checkRobust), for train_config.ts.
 */
import { ConfigError } from './config_option.ts';
import { formatCommHook, type CommHookSpec } from './comm_hook_spec.ts';
import { DEFAULT_CLIP_ITERATIONS, MAX_CLIP_ITERATIONS, type AggregationSpec } from '../parallel/robust/aggregators.ts';
import { ATTACK_KINDS, type AttackKind, type AttackPlan } from '../parallel/robust/attacks.ts';

/** An AggregationSpec as the job's configuration holds it: every field set (JSON as it is, in checkpoints' metadata). */
export type AggregationConfig =
  | { kind: 'mean' }
  | { kind: 'trimmed-mean'; trim: number }
  | { kind: 'median' }
  | { kind: 'centered-clip'; tau: number | 'auto'; iterations: number };

/**
 * The attack as the job's configuration holds it (for measuring defences): its kind, its
 * strength (scale/flip: the factor, noise: the std, alie: z; null: robust/attacks.ts's default)
 * and how many ranks play it (the last ones).
 */
// A type, not an interface: the configuration must stay assignable to Json (an interface has no index signature).
export type AttackConfig = {
  kind: AttackKind;
  strength: number | null;
  attackers: number;
};

/** The library's plan for an AttackConfig (DDPOptions.attack, DiLoCoOptions.attack). */
export function attackPlanOf(c: AttackConfig): AttackPlan {
  const { kind, strength, attackers } = c;
  if (strength === null) return { kind, attackers };
  return kind === 'noise'
    ? { kind, std: strength, attackers }
    : kind === 'alie'
      ? { kind, z: strength, attackers }
      : { kind, factor: strength, attackers };
}

/**
 * The one rule of the option's text: each aggregation's name and form (the launcher's usage,
 * the option's rule and the parser's errors all print these). parseAggregation reads exactly these.
 */
export const AGGREGATION_FORMS = {
  mean: 'mean',
  'trimmed-mean': 'trimmed-mean:B',
  median: 'median',
  'centered-clip': 'centered-clip[:TAU|auto][:ITERATIONS]',
} as const satisfies Record<AggregationConfig['kind'], string>;
/** Every aggregation's name, in the grammar's order. */
export const AGGREGATION_NAMES = Object.keys(AGGREGATION_FORMS) as ReadonlyArray<AggregationConfig['kind']>;

/** The grammar in one line: every form, `|` between them (the launcher's usage). */
export const AGGREGATION_GRAMMAR = AGGREGATION_NAMES.map((k) => AGGREGATION_FORMS[k]).join('|');

/** What the aggregation option may be, in words. */
export const AGGREGATION_RULE = `${AGGREGATION_FORMS.mean}, ${AGGREGATION_FORMS['trimmed-mean']} (cut the B largest and B smallest values of each coordinate), ${AGGREGATION_FORMS.median}, or ${AGGREGATION_FORMS['centered-clip']} (e.g. trimmed-mean:1, centered-clip, centered-clip:0.5:3)`;

/** The create form's choices (a select): one of each kind, with the defaults a class can use as they are. */
export const AGGREGATION_PRESETS = ['mean', 'trimmed-mean:1', 'median', 'centered-clip'] as const;

/** The most a trim or an attacker count can be: below the largest world. */
const MAX_RANKS = 64;

/**
 * One of AGGREGATION_FORMS (`mean`, `trimmed-mean:B`, `median`, `centered-clip[:TAU|auto][:ITERATIONS]`) as an
 * AggregationSpec (centered-clip's TAU defaults to auto: the lower median of the ranks'
 * distances each iteration; ITERATIONS to 3). Throws ConfigError (option aggregation) naming the
 * item that is wrong and what to write.
 */
export function parseAggregation(raw: string): AggregationConfig {
  const [kind = '', ...args] = raw.split(':');
  const bad = (rule: string) => new ConfigError('aggregation', raw, rule);
  switch (kind) {
    case 'mean':
    case 'median':
      if (args.length > 0) throw bad(`just ${kind}, without "${args.join(':')}" after it`);
      return { kind };
    case 'trimmed-mean': {
      const b = args.length === 1 && /^\d{1,3}$/.test(args[0]!) ? Number(args[0]) : NaN;
      if (!(Number.isSafeInteger(b) && b >= 1 && b < MAX_RANKS / 2)) {
        throw bad(
          `trimmed-mean:B with B, the values cut at each end of every coordinate, an integer from 1 to ${MAX_RANKS / 2 - 1} (e.g. trimmed-mean:1, which needs at least 3 tabs to cut anything)`,
        );
      }
      return { kind, trim: b };
    }
    case 'centered-clip': {
      if (args.length > 2)
        throw bad(
          `${AGGREGATION_FORMS['centered-clip']} (e.g. centered-clip, centered-clip:0.5 or centered-clip:auto:5): at most two items after centered-clip`,
        );
      const [tauText = 'auto', itText] = args;
      const tau = tauText === 'auto' ? 'auto' : /^\d{1,6}(\.\d{1,12})?(e-?\d{1,2})?$/.test(tauText) ? Number(tauText) : NaN;
      if (tau !== 'auto' && !(Number.isFinite(tau) && tau > 0))
        throw bad(
          `centered-clip:TAU with TAU a positive decimal number (the clipping radius, in the gradients' units) or auto (the median distance each iteration); "${tauText}" is not one`,
        );
      const iterations = itText === undefined ? DEFAULT_CLIP_ITERATIONS : /^\d{1,3}$/.test(itText) ? Number(itText) : NaN;
      if (!(Number.isSafeInteger(iterations) && iterations >= 1 && iterations <= MAX_CLIP_ITERATIONS)) {
        throw bad(`centered-clip:TAU:ITERATIONS with ITERATIONS an integer from 1 to ${MAX_CLIP_ITERATIONS}; "${itText ?? ''}" is not one`);
      }
      return { kind, tau, iterations };
    }
    default:
      throw bad(`${AGGREGATION_RULE}; "${kind}" is not an aggregation`);
  }
}

/** An AggregationSpec as the option's text (what parseAggregation reads back), defaults left out. */
export function formatAggregation(spec: AggregationSpec): string {
  switch (spec.kind) {
    case 'trimmed-mean':
      return `trimmed-mean:${spec.trim}`;
    case 'centered-clip': {
      const iterations = spec.iterations ?? DEFAULT_CLIP_ITERATIONS;
      if (iterations !== DEFAULT_CLIP_ITERATIONS) return `centered-clip:${spec.tau}:${iterations}`;
      return spec.tau === 'auto' ? 'centered-clip' : `centered-clip:${spec.tau}`;
    }
    default:
      return spec.kind;
  }
}

/** What the attack option may be, in words. */
export const ATTACK_RULE =
  'scale[:FACTOR], flip[:FACTOR], noise[:STD] or alie[:Z] (for measuring defences: the last `attackers` ranks play it on their own gradients; e.g. scale, flip:-4, noise:1, alie:1)';

/** `scale[:FACTOR]`, `flip[:FACTOR]`, `noise[:STD]` or `alie[:Z]` as its kind and strength (null: the default in robust/attacks.ts). Throws ConfigError (option attack). */
export function parseAttack(raw: string): Omit<AttackConfig, 'attackers'> {
  const [kind = '', ...args] = raw.split(':');
  const bad = (rule: string) => new ConfigError('attack', raw, rule);
  if (!(ATTACK_KINDS as readonly string[]).includes(kind)) throw bad(`${ATTACK_RULE}; "${kind}" is not an attack`);
  const k = kind as AttackKind;
  if (args.length === 0) return { kind: k, strength: null };
  const n = args.length === 1 && /^-?\d{1,9}(\.\d{1,12})?$/.test(args[0]!) ? Number(args[0]) : NaN;
  const what =
    k === 'noise' ? 'STD, a standard deviation >= 0' : k === 'alie' ? 'Z, the standard deviations to shift by' : 'FACTOR, the multiplier';
  if (!Number.isFinite(n) || (k === 'noise' && n < 0))
    throw bad(
      `${k}:${k === 'noise' ? 'STD' : k === 'alie' ? 'Z' : 'FACTOR'} with ${what} (a decimal number); "${args.join(':')}" is not one`,
    );
  return { kind: k, strength: n };
}

/** An attack as the option's text (what parseAttack reads back). */
export function formatAttack(spec: Pick<AttackConfig, 'kind' | 'strength'>): string {
  return spec.strength === null ? spec.kind : `${spec.kind}:${spec.strength}`;
}

/** `attack` and `attackers` as a plan (null: no attack), the attackers fewer than the smallest world (`min`). Throws ConfigError. */
export function attackPlan(raw: string | null, attackers: number, min: number): AttackConfig | null {
  if (raw === null) {
    if (attackers > 0)
      throw new ConfigError(
        'attackers',
        String(attackers),
        '0 (or left out) without attack: it says how many ranks play the attack (give attack=scale|flip|noise|alie)',
      );
    return null;
  }
  const spec = parseAttack(raw);
  if (attackers < 1 || attackers >= min) {
    throw new ConfigError(
      'attackers',
      String(attackers),
      `from 1 to ${min - 1}, below the smallest world (min ${min}): the last K ranks attack and at least one must stay honest`,
    );
  }
  return { ...spec, attackers };
}

/**
 * Robust aggregation and attacks are DDP's: refused with a parameter-server strategy, with
 * pipelines, and (robust kinds) with a hook other than DiLoCo, whose outer step takes the
 * aggregation instead. Throws ConfigError.
 */
export function checkRobust(
  raw: string,
  aggregation: AggregationConfig,
  attack: AttackConfig | null,
  hook: CommHookSpec,
  strategy: string,
  pp: number,
): void {
  const option = aggregation.kind !== 'mean' ? 'aggregation' : attack ? 'attack' : null;
  if (option === null) return;
  const value = option === 'aggregation' ? raw : formatAttack(attack!);
  if (strategy !== 'ddp')
    throw new ConfigError(
      option,
      value,
      `left out with strategy ${strategy}: robust aggregation and attacks are DDP's (every rank's gradients combined), and parameter servers take each push on its own`,
    );
  if (pp > 1)
    throw new ConfigError(
      option,
      value,
      `left out with pipeline stages (here pp ${pp}): robust aggregation with pipelines is not supported yet`,
    );
  if (aggregation.kind !== 'mean' && hook.kind !== 'none' && hook.kind !== 'diloco') {
    throw new ConfigError(
      'aggregation',
      raw,
      `mean (or left out) with commHook ${formatCommHook(hook)}: robust aggregation needs every rank's whole gradient as sent, which a communication hook compresses or skips (with diloco, the outer step aggregates robustly)`,
    );
  }
}
