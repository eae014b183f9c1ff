/**
 * FOR MEASURING DEFENCES ONLY: what a hostile rank does to its own contribution (a gradient, a
 * DiLoCo pseudo-gradient) before it sends it, so that a run can show what robust aggregation
 * (aggregators.ts) holds off and what the mean does not. DDP's and DiLoCo's `attack` option
 * (an AttackPlan) makes the last `attackers` ranks of each group play it; the train job's
 * `attack` / `attackers` options (the launcher's --attack KIND --attackers K) set it.
 *
 * - `scale`: x `factor` (default 1000).
 * - `flip`: x `factor` (default -4): the sign flipped and enlarged, as is common in the
 *   literature (a plain x -1 from one rank of N only shrinks the mean's step).
 * - `noise`: the contribution replaced by Gaussian noise of standard deviation `std` (default 1)
 *   per coordinate (the "Gaussian attack"), from a seeded generator (seed, rank, step).
 * - `alie` ("A Little Is Enough", Baruch et al. 2019): mu - z * sigma per coordinate, where the
 *   paper's colluding attackers know the honest ranks' mean mu and standard deviation sigma. A
 *   single attacker sees only its own gradient: mu is estimated by it and sigma, for every
 *   coordinate, by its root mean square (in small-batch SGD the ranks' gradients differ by about
 *   their own size), so the attack is a small consistent shift of -z x RMS(g) on every coordinate.
 *   z defaults to 1: the paper's z_max = Phi^-1((n - s) / n), s = floor(n/2 + 1) - f, is about 1
 *   for its 50 workers with 12 attackers, and 0 (no attack at all) for 4 ranks with 1.
 */
import { Mulberry32 } from '../../datasets/synthetic.ts';

export const ATTACK_KINDS = ['scale', 'flip', 'noise', 'alie'] as const;
export type AttackKind = (typeof ATTACK_KINDS)[number];

/** One attack and its strength (the defaults above where left out). */
export interface AttackSpec {
  kind: AttackKind;
  /** scale: the factor (default 1000); flip: the factor (default -4). */
  factor?: number;
  /** noise: the standard deviation (default 1). */
  std?: number;
  /** alie: how many estimated standard deviations to shift by (default 1). */
  z?: number;
  /** noise: the generator's seed (default 0); each rank and step draws its own stream from it. */
  seed?: number;
}

/** An attack and who plays it: the last `attackers` ranks of each group (at least one honest rank must be left). */
export interface AttackPlan extends AttackSpec {
  attackers: number;
}

export const DEFAULT_ATTACK = { scaleFactor: 1000, flipFactor: -4, std: 1, z: 1 } as const;

/** Refuses a plan no run can play, saying what was given. */
export function checkAttackPlan(plan: AttackPlan): void {
  if (!(ATTACK_KINDS as readonly string[]).includes(plan.kind))
    throw new RangeError(`attack: kind must be ${ATTACK_KINDS.join(', ')}, got ${String(plan.kind)}`);
  if (!Number.isSafeInteger(plan.attackers) || plan.attackers < 0)
    throw new RangeError(`attack: attackers must be an integer >= 0 (the last K ranks attack), got ${String(plan.attackers)}`);
  for (const key of ['factor', 'std', 'z', 'seed'] as const) {
    const v = plan[key];
    if (v !== undefined && !Number.isFinite(v)) throw new RangeError(`attack: ${key} must be a finite number, got ${String(v)}`);
  }
  if (plan.std !== undefined && plan.std < 0) throw new RangeError(`attack: std must be >= 0, got ${plan.std}`);
}

/** Whether rank `rank` of `worldSize` plays `plan` (the last `attackers` ranks; never all of them). */
export function isAttacker(plan: AttackPlan | undefined, rank: number, worldSize: number): boolean {
  if (!plan || plan.attackers <= 0) return false;
  const k = Math.min(plan.attackers, worldSize - 1);
  return rank >= worldSize - k;
}

/** Where in the run the contribution is (the noise's stream depends on it). */
export interface AttackContext {
  rank: number;
  step: number;
  /** Which part of the step's contribution (a DDP bucket, a DiLoCo fragment): 0 for a whole one. */
  part?: number;
}

/** Plays `spec` on `values` in place (this rank's own contribution, before it is sent). */
export function applyAttack(spec: AttackSpec, values: Float32Array, ctx: AttackContext): void {
  switch (spec.kind) {
    case 'scale':
    case 'flip': {
      const f = spec.factor ?? (spec.kind === 'scale' ? DEFAULT_ATTACK.scaleFactor : DEFAULT_ATTACK.flipFactor);
      for (let i = 0; i < values.length; i++) values[i] = values[i]! * f;
      return;
    }
    case 'noise': {
      const std = spec.std ?? DEFAULT_ATTACK.std;
      const rng = new Mulberry32(mix(spec.seed ?? 0, ctx.rank, ctx.step, ctx.part ?? 0));
      for (let i = 0; i < values.length; i++) values[i] = std * gaussian(rng);
      return;
    }
    case 'alie': {
      const z = spec.z ?? DEFAULT_ATTACK.z;
      let s = 0;
      for (let i = 0; i < values.length; i++) s += values[i]! * values[i]!;
      const sigma = values.length === 0 ? 0 : Math.sqrt(s / values.length);
      for (let i = 0; i < values.length; i++) values[i] = values[i]! - z * sigma;
      return;
    }
    default: {
      const unknown: never = spec.kind;
      throw new RangeError(`unknown attack ${String(unknown)}`);
    }
  }
}

/** A standard normal draw (Box-Muller). */
function gaussian(rng: Mulberry32): number {
  const u = 1 - rng.nextFloat(); // (0, 1]: log(0) never happens
  const v = rng.nextFloat();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
}

/** One 32-bit seed from several integers. */
function mix(...parts: number[]): number {
  let h = 0x811c9dc5;
  for (const p of parts) {
    h = Math.imul(h ^ (p | 0), 0x01000193);
    h = Math.imul(h ^ Math.floor(p / 0x100000000), 0x01000193);
  }
  return h >>> 0;
}
