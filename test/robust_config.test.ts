/**
 * Robust aggregation and attacks as the train job's options (src/jobs/aggregation_spec.ts, read
 * by train_config.ts): the page's URL parameters and the launcher's --aggregation, --attack and
 * --attackers, parsed with errors that say what to write, round trips of the text, and the rules
 * against the other options; runElastic's check of its own options.
 */
import { describe, expect, it } from 'vitest';
import {
  ConfigError,
  attackPlanOf,
  configParams,
  formatAggregation,
  parseAggregation,
  parseTrainConfig,
  urlOption,
  type TrainConfig,
} from '../src/jobs/train_config.ts';
import { trainJobProblem } from '../launcher/job_flags.ts';
import { checkOptions } from '../src/parallel/ddp/runner_types.ts';
import type { ElasticRunOptions } from '../src/parallel/ddp/runner_types.ts';
import { errorOf as thrownAs } from './fixtures/errors.ts';

const parse = (query: string): TrainConfig => {
  const params = new URLSearchParams(query);
  return parseTrainConfig((name) => urlOption(params, name));
};

const errorOf = (query: string): ConfigError => {
  try {
    parse(query);
  } catch (err) {
    if (err instanceof ConfigError) return err;
    throw err;
  }
  throw new Error(`${query} parsed`);
};

describe('the aggregation option', () => {
  it('reads mean, trimmed-mean:B, median and centered-clip[:TAU|auto][:ITERATIONS], and writes them back', () => {
    expect(parse('world=4').aggregation).toEqual({ kind: 'mean' });
    expect(parse('world=4&aggregation=trimmed-mean:1').aggregation).toEqual({ kind: 'trimmed-mean', trim: 1 });
    expect(parse('world=4&aggregation=median').aggregation).toEqual({ kind: 'median' });
    expect(parse('world=4&aggregation=centered-clip').aggregation).toEqual({ kind: 'centered-clip', tau: 'auto', iterations: 3 });
    expect(parse('world=4&aggregation=centered-clip:0.5:10').aggregation).toEqual({ kind: 'centered-clip', tau: 0.5, iterations: 10 });
    for (const text of [
      'mean',
      'trimmed-mean:2',
      'median',
      'centered-clip',
      'centered-clip:0.5',
      'centered-clip:auto:5',
      'centered-clip:1e-3:2',
    ]) {
      expect(formatAggregation(parseAggregation(text)), text).toBe(text.replace('1e-3', '0.001'));
    }
    // A link made from the config reads back to it.
    const config = parse('world=4&aggregation=centered-clip:0.25:4&attack=flip:-4&attackers=2&min=3');
    expect(parse(configParams(config).toString())).toEqual(config);
  });

  it('says what is wrong and what to write', () => {
    expect(errorOf('world=4&aggregation=krum').message).toMatch(
      /option aggregation must be mean, trimmed-mean:B .*; "krum" is not an aggregation/,
    );
    expect(errorOf('world=4&aggregation=trimmed-mean').rule).toMatch(
      /trimmed-mean:B with B, the values cut at each end of every coordinate, an integer from 1 to 31/,
    );
    expect(errorOf('world=4&aggregation=trimmed-mean:0').rule).toMatch(/an integer from 1/);
    expect(errorOf('world=4&aggregation=median:1').rule).toBe('just median, without "1" after it');
    expect(errorOf('world=4&aggregation=centered-clip:-1').option).toBe('aggregation');
    expect(errorOf('world=4&aggregation=centered-clip:0').rule).toMatch(/TAU a positive decimal number .* or auto/);
    expect(errorOf('world=4&aggregation=centered-clip:auto:0').rule).toMatch(/ITERATIONS an integer from 1 to 100/);
  });

  it("is DDP's: refused with parameter servers, pipelines and hooks other than DiLoCo (whose outer step takes it)", () => {
    expect(errorOf('world=4&aggregation=median&strategy=ps').rule).toMatch(/left out with strategy ps/);
    expect(errorOf('world=4&aggregation=median&pp=2&dp=2').rule).toMatch(/left out with pipeline stages \(here pp 2\)/);
    expect(errorOf('world=4&aggregation=median&commHook=fp16').rule).toMatch(
      /mean \(or left out\) with commHook fp16: robust aggregation needs every rank's whole gradient/,
    );
    expect(parse('world=4&aggregation=median&commHook=diloco:8').aggregation).toEqual({ kind: 'median' });
  });
});

describe('the attack options (for measuring defences)', () => {
  it('reads --attack KIND[:X] and --attackers K (the last K ranks; 1 by default), below the smallest world', () => {
    expect(parse('world=4&attack=scale').attack).toEqual({ kind: 'scale', strength: null, attackers: 1 });
    expect(parse('world=4&attack=noise:2&attackers=2').attack).toEqual({ kind: 'noise', strength: 2, attackers: 2 });
    expect(attackPlanOf({ kind: 'noise', strength: 2, attackers: 2 })).toEqual({ kind: 'noise', std: 2, attackers: 2 });
    expect(attackPlanOf({ kind: 'flip', strength: null, attackers: 1 })).toEqual({ kind: 'flip', attackers: 1 });
    expect(parse('world=4').attack).toBeNull();
    expect(errorOf('world=4&attack=scale&attackers=4').rule).toMatch(
      /from 1 to 3, below the smallest world \(min 4\).*at least one must stay honest/,
    );
    expect(errorOf('world=4&min=2&attack=scale&attackers=2').rule).toMatch(/from 1 to 1/);
    expect(errorOf('world=4&attackers=1').rule).toMatch(/0 \(or left out\) without attack/);
    expect(errorOf('world=4&attack=bribe').message).toMatch(/"bribe" is not an attack/);
    expect(errorOf('world=4&attack=noise:-1').rule).toMatch(/STD, a standard deviation >= 0/);
    expect(errorOf('world=4&attack=scale&strategy=central').option).toBe('attack');
  });

  it("the launcher phrases the job schema's errors as its flags", () => {
    expect(trainJobProblem({ aggregation: 'trimmed-mean:x' }, 4)).toMatch(
      /^--aggregation trimmed-mean:x: the train job takes trimmed-mean:B/,
    );
    expect(trainJobProblem({ aggregation: 'trimmed-mean:1', attack: 'flip', attackers: '1' }, 4)).toBeUndefined();
    expect(trainJobProblem({ attack: 'alie', attackers: '4' }, 4)).toMatch(/^--attackers 4: the train job takes from 1 to 3/);
  });
});

describe("runElastic's options", () => {
  const base = {
    url: 'ws://x',
    session: 's',
    state: {} as ElasticRunOptions['state'],
    datasetLength: 8,
    batchSize: 2,
    step: async () => {},
  } as unknown as ElasticRunOptions;
  it('refuses a robust DDP aggregation beside a hook, local SGD or DiLoCo, and a bad spec, before joining', () => {
    expect(() => checkOptions({ ...base, ddp: { aggregation: { kind: 'median' } }, diloco: { syncEvery: 4 } })).toThrow(
      thrownAs(TypeError, /ddp.aggregation median does not combine with diloco.*give it to diloco.aggregation/),
    );
    expect(() => checkOptions({ ...base, ddp: { aggregation: { kind: 'median' } }, modelAverager: { period: 2 } })).toThrow(
      thrownAs(TypeError, /does not combine with modelAverager/),
    );
    expect(() => checkOptions({ ...base, ddp: { aggregation: { kind: 'trimmed-mean', trim: 1.5 } } })).toThrow(
      thrownAs(RangeError, /trim must be an integer/),
    );
    expect(() =>
      checkOptions({ ...base, diloco: { syncEvery: 4, aggregation: { kind: 'centered-clip', tau: 'auto', iterations: 0 } } }),
    ).toThrow(thrownAs(RangeError, /iterations must be an integer/));
    expect(() => checkOptions({ ...base, ddp: { attack: { kind: 'scale', attackers: -1 } } })).toThrow(
      thrownAs(RangeError, /attackers must be an integer >= 0/),
    );
    expect(() => checkOptions({ ...base, ddp: { aggregation: { kind: 'median' } } })).not.toThrow();
  });
});
