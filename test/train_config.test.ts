/** The training job's one schema: the URL parser's defaults, its refusals, and links that round-trip. */
import { describe, expect, it } from 'vitest';
import {
  ConfigError,
  DEFAULT_LR,
  MAX_WORLD_SIZE,
  TRAIN_OPTIONS,
  configParams,
  formatCommHook,
  parseCommHook,
  parseTrainConfig,
  sampleDue,
} from '../src/jobs/train_config.ts';
import { FORM_DEFAULTS, TRAIN_FORM_LABELS } from '../client/ui/train_form_labels.ts';
import { readLink, type LinkProblem } from '../client/ui/link_check.ts';
import { parse, refusal } from './fixtures/train_config.ts';
import { errorOf } from './fixtures/errors.ts';

describe('parseTrainConfig', () => {
  it('fills the defaults the README quotes; a fixed size is min = max = world', () => {
    expect(parse('world=3')).toEqual({
      model: 'mlp',
      hidden: null,
      dataset: 'mnist',
      local: null,
      context: null,
      streamData: 'auto',
      batchSize: 64,
      lr: DEFAULT_LR.adam,
      optimizer: 'adam',
      epochs: 1,
      steps: null,
      timeLimit: null,
      trainSize: 0,
      testSize: 0,
      seed: 0,
      shuffle: true,
      balance: true,
      voteWithGradients: true,
      backend: 'webgpu',
      min: 3,
      max: 3,
      checkpointEvery: 0,
      evalEvery: 100,
      firstSample: 0,
      resumeFrom: null,
      pp: 1,
      dp: 1,
      microBatches: 1,
      schedule: 'gpipe',
      activationDtype: 'float32',
      splitPoints: null,
      strategy: 'ddp',
      ps: 1,
      maxStaleness: null,
      stalenessLr: false,
      slow: null,
      commHook: { kind: 'none' },
      devices: 1,
      linkWindowBytes: null,
      aggregation: { kind: 'mean' },
      attack: null,
    });
    expect(DEFAULT_LR.adam).toBe(0.003);
  });

  it('the language model measures its backend (auto) and writes a sample every 20 steps by default; either can be set', () => {
    expect(parse('world=2&model=lm')).toMatchObject({ backend: 'auto', firstSample: 10, dataset: 'text' });
    expect(parse('world=2&model=lm&backend=cpu&first-sample=5')).toMatchObject({ backend: 'cpu', firstSample: 5 });
    expect(parse('world=2&model=mlp&backend=auto')).toMatchObject({ backend: 'auto' });
    // After N, 2N, 4N ... steps: early, then ever more rarely.
    expect(Array.from({ length: 200 }, (_, i) => i + 1).filter((s) => sampleDue(s, 10))).toEqual([10, 20, 40, 80, 160]);
    expect([1, 2, 3, 4, 5, 6, 7, 8].filter((s) => sampleDue(s, 1))).toEqual([1, 2, 4, 8]);
    expect([0, 10, 20].some((s) => sampleDue(s, 0))).toBe(false);
    const lm = parse('world=2&model=lm');
    expect(parse(configParams(lm).toString())).toEqual(lm);
  });

  it("takes a pipeline run's options as the launcher passes them (kebab-case), with 4 micro-batches by default", () => {
    expect(parse('world=4&pp=2&dp=2&micro-batches=8&schedule=1f1b&activation-dtype=float16')).toMatchObject({
      min: 4,
      max: 4,
      pp: 2,
      dp: 2,
      microBatches: 8,
      schedule: '1f1b',
      activationDtype: 'float16',
    });
    expect(parse('world=2&pp=2')).toMatchObject({ pp: 2, dp: 1, microBatches: 4 });
    const config = parse('world=4&pp=2&dp=2&micro-batches=8&schedule=1f1b');
    expect(parse(configParams(config).toString())).toEqual(config);
    const split = parse('world=3&pp=3&split-points=1,5');
    expect(split.splitPoints).toEqual([1, 5]);
    expect(parse(configParams(split).toString())).toEqual(split);
  });

  it('refuses a pipeline that is not the world, an elastic one, replicas without stages, and more micro-batches than samples', () => {
    const option = (query: string) => {
      try {
        parse(query);
      } catch (err) {
        return (err as ConfigError).option;
      }
      return null;
    };
    expect(option('world=3&pp=2&dp=2')).toBe('pp');
    expect(option('world=4&min=2&pp=2&dp=2')).toBe('pp');
    expect(option('world=2&dp=2')).toBe('dp');
    expect(option('world=2&pp=2&batch-size=4&micro-batches=8')).toBe('microBatches');
    expect(option('world=4&pp=2&dp=2')).toBeNull();
    expect(option('world=2&pp=2&split-points=1,2')).toBe('splitPoints');
    expect(option('world=2&pp=2&split-points=a')).toBe('splitPoints');
  });

  it("takes kebab-case too, and the learning rate follows the optimizer's default", () => {
    expect(parse('world=2&batch-size=16&optimizer=sgd')).toMatchObject({ batchSize: 16, optimizer: 'sgd', lr: 0.05 });
    expect(parse('world=4&min=2&max=5')).toMatchObject({ min: 2, max: 5 });
  });

  it('refuses a bad value naming the option, the value and what is allowed', () => {
    expect(refusal('world=abc').message).toBe('option world must be an integer from 1 to 64, got "abc"');
    expect(refusal('world=-2')).toMatchObject({ name: 'ConfigError', option: 'world', value: '-2' });
    expect(refusal('world=100').message).toBe('option world must be an integer from 1 to 64, got "100"');
    expect(refusal('world=4&max=65').option).toBe('max');
    expect(refusal('world=4&min=0').option).toBe('min');
    expect(refusal('world=2&lr=0').message).toBe('option lr must be a number above 0 and at most 10, got "0"');
    expect(refusal('world=2&model=resnet').message).toBe('option model must be one of mlp, cnn, lm, user, got "resnet"');
    expect(refusal('world=2&min=3').message).toBe('option min must be at most the session\'s largest size (2), got "3"');
  });

  it("the host's own model and data: model=user and dataset=user with every strategy, no hidden width", () => {
    expect(parse('world=2&model=user&dataset=user')).toMatchObject({ model: 'user', dataset: 'user', hidden: null });
    expect(parse('world=3&model=user&strategy=ps')).toMatchObject({ model: 'user', strategy: 'ps' });
    expect(parse('world=2&model=user&pp=2')).toMatchObject({ model: 'user', pp: 2 });
    expect(() => parse('world=2&model=user&hidden=64')).toThrow(errorOf(ConfigError, /option hidden must be left out with model user/));
  });

  it('the language model: lm reads text and text is for lm, windows of 64 and batches of 16 unless told, a width its heads divide', () => {
    expect(parse('world=2&model=lm')).toMatchObject({ model: 'lm', dataset: 'text', context: 64, batchSize: 16, hidden: null });
    expect(parse('world=2&model=lm&dataset=text&context=32&hidden=48&batchSize=4')).toMatchObject({
      context: 32,
      hidden: 48,
      batchSize: 4,
    });
    expect(parse('world=2&model=lm&pp=2')).toMatchObject({ model: 'lm', pp: 2 });
    expect(parse('world=2&model=lm&commHook=diloco:8')).toMatchObject({ model: 'lm', commHook: { kind: 'diloco', syncEvery: 8 } });
    expect(refusal('world=2&model=lm&dataset=mnist')).toMatchObject({ option: 'dataset', value: 'mnist' });
    expect(refusal('world=2&model=lm&dataset=mnist').message).toContain("text (or user, the host's own text) with model lm");
    expect(refusal('world=2&dataset=text')).toMatchObject({ option: 'model', value: 'mlp' });
    expect(refusal('world=2&context=32').message).toContain('left out unless model is lm');
    // The host's own text (npm start -- --data FILE.txt): what the server offers is the tab's to check.
    expect(parse('world=2&model=lm&dataset=user')).toMatchObject({ model: 'lm', dataset: 'user', context: 64 });
    expect(refusal('world=2&model=lm&hidden=30').message).toContain('a multiple of 4');
    expect(refusal('world=2&model=lm&context=1').option).toBe('context');
    const config = parse('world=2&model=lm&context=32&hidden=32');
    expect(parse(configParams(config).toString())).toEqual(config);
  });

  it('a config turned into link parameters parses back to itself', () => {
    const config = parse('world=4&min=2&dataset=synthetic&steps=50&trainSize=1024&optimizer=sgd&lr=0.1&seed=7');
    expect(parse(configParams(config).toString())).toEqual(config);
  });
});

describe('parameter-server options: strategy, ps, maxStaleness, stalenessLr', () => {
  it('reads them as the launcher passes them (kebab-case, --staleness-lr as true), and a link keeps them', () => {
    expect(parse('world=4&min=3&strategy=ps&ps=2&max-staleness=4&staleness-lr=true')).toMatchObject({
      min: 3,
      max: 4,
      strategy: 'ps',
      ps: 2,
      maxStaleness: 4,
      stalenessLr: true,
    });
    expect(parse('world=3&strategy=ps&maxStaleness=0')).toMatchObject({ strategy: 'ps', ps: 1, maxStaleness: 0, stalenessLr: false });
    expect(parse('world=2&strategy=central')).toMatchObject({ strategy: 'central', ps: 1, maxStaleness: null, stalenessLr: false });
    // ps=1 is the default: harmless with ddp and central.
    expect(parse('world=2&strategy=ddp&ps=1')).toMatchObject({ strategy: 'ddp', ps: 1 });
    expect(parse('world=2&strategy=central&ps=1').ps).toBe(1);
    for (const query of [
      'world=4&min=3&strategy=ps&ps=2&max-staleness=4&staleness-lr=true',
      'world=2&strategy=central',
      'world=5&min=2&strategy=ps&slow=4:3',
    ]) {
      const config = parse(query);
      expect(parse(configParams(config).toString())).toEqual(config);
    }
    // A DDP run's link says nothing new: the options at their defaults are left out.
    const ddp = configParams(parse('world=2'));
    for (const name of ['strategy', 'ps', 'maxStaleness', 'stalenessLr']) expect(ddp.has(name)).toBe(false);
    expect(configParams(parse('world=3&strategy=ps&ps=2&max-staleness=2')).toString()).toMatch(/strategy=ps&ps=2&maxStaleness=2/);
  });

  it('are in the schema, outside the create form, with labels and hints on the page', () => {
    for (const name of ['strategy', 'ps', 'maxStaleness', 'stalenessLr'] as const) {
      const spec = TRAIN_OPTIONS.find((o) => o.name === name)!;
      expect(spec.inForm).toBe(false);
      expect(TRAIN_FORM_LABELS[name].label.length).toBeGreaterThan(0);
      expect(TRAIN_FORM_LABELS[name].hint?.length).toBeGreaterThan(20);
    }
    expect(TRAIN_OPTIONS.find((o) => o.name === 'strategy')!.kind).toEqual({ type: 'choice', choices: ['ddp', 'ps', 'central'] });
  });

  it('refuses bad values naming the option and what is allowed', () => {
    expect(refusal('world=3&strategy=async').message).toBe('option strategy must be one of ddp, ps, central, got "async"');
    expect(refusal('world=3&strategy=ps&ps=0').message).toBe('option ps must be an integer from 1 to 63, got "0"');
    expect(refusal('world=3&strategy=ps&ps=1.5').option).toBe('ps');
    expect(refusal('world=3&strategy=ps&max-staleness=-1').message).toBe(
      'option maxStaleness must be an integer from 0 to 1000000, got "-1"',
    );
    expect(refusal('world=3&strategy=ps&staleness-lr=yes').message).toBe('option stalenessLr must be true or false, got "yes"');
  });

  it('ps only with strategy ps, and central keeps one server', () => {
    expect(refusal('world=3&ps=2').message).toBe(
      'option ps must be 1 (or left out) unless strategy is ps: parameter servers need strategy=ps, got "2"',
    );
    expect(refusal('world=3&strategy=central&ps=2').message).toBe(
      'option ps must be 1 with strategy central, which keeps every variable on one server (for several, use strategy=ps), got "2"',
    );
  });

  it('leaves at least one worker, in the largest world and in the smallest', () => {
    expect(refusal('world=2&strategy=ps&ps=2').message).toBe(
      'option ps must be at most 1, the world size (2) less one: every tab that is not a server is a worker, and at least one is needed, got "2"',
    );
    expect(refusal('world=1&strategy=central').message).toBe(
      'option world must be at least 2 with strategy central: a parameter server and at least one worker, got "1"',
    );
    expect(refusal('world=1&strategy=ps').option).toBe('world');
    expect(refusal('world=4&min=2&strategy=ps&ps=2').message).toBe(
      'option min must be at least 3 with strategy ps: the 2 parameter servers and one worker (with fewer tabs nothing trains), got "2"',
    );
    expect(parse('world=4&min=3&strategy=ps&ps=2')).toMatchObject({ min: 3, ps: 2 });
    expect(parse('world=3&strategy=ps&ps=2')).toMatchObject({ min: 3, max: 3, ps: 2 });
  });

  it('the staleness options only with strategy ps', () => {
    expect(refusal('world=3&max-staleness=2').message).toBe(
      'option maxStaleness must be left out unless strategy is ps: only asynchronous parameter servers take stale pushes, got "2"',
    );
    expect(refusal('world=3&strategy=central&max-staleness=2').message).toBe(
      'option maxStaleness must be left out unless strategy is ps: strategy central is synchronous, its pushes are never stale, got "2"',
    );
    expect(refusal('world=3&strategy=central&staleness-lr=true')).toMatchObject({ option: 'stalenessLr', value: 'true' });
    expect(refusal('world=3&staleness-lr=true').message).toBe(
      'option stalenessLr must be false (or left out) unless strategy is ps: only asynchronous parameter servers take stale pushes, got "true"',
    );
    expect(parse('world=3&staleness-lr=false').stalenessLr).toBe(false);
  });

  it('a PS strategy does not combine with a pipeline: the error names both', () => {
    expect(refusal('world=2&strategy=ps&pp=2').message).toBe(
      'option strategy must be ddp with pipeline stages or replicas (here pp 2): a pipeline splits the model between tabs while parameter servers hold all of it, so leave out pp and dp, or strategy, got "ps"',
    );
    expect(refusal('world=4&strategy=central&pp=2&dp=2').message).toMatch(
      /^option strategy must be ddp with pipeline stages or replicas \(here pp 2, dp 2\)/,
    );
    expect(refusal('world=4&strategy=ps&dp=2').message).toMatch(/\(here dp 2\).*got "ps"$/);
  });

  it('balance is DDP’s: true by default there, false with pipelines and parameter servers, and refused given true where it would do nothing', () => {
    expect(parse('world=2').balance).toBe(true);
    expect(parse('world=2&balance=false').balance).toBe(false);
    expect(parse('world=3&strategy=ps').balance).toBe(false);
    expect(parse('world=2&pp=2').balance).toBe(false);
    expect(parse('world=2&pp=2&balance=false').balance).toBe(false);
    expect(refusal('world=3&strategy=ps&balance=true')).toMatchObject({ name: 'ConfigError', option: 'balance', value: 'true' });
    expect(refusal('world=3&strategy=central&balance=true').message).toMatch(
      /^option balance must be false \(or left out\) with strategy central/,
    );
    expect(refusal('world=2&pp=2&balance=true').message).toMatch(
      /^option balance must be false \(or left out\) with pipeline stages \(here pp 2\)/,
    );
    // A link keeps the default out, with every strategy.
    for (const query of ['world=2', 'world=3&strategy=ps', 'world=2&pp=2']) expect(configParams(parse(query)).has('balance')).toBe(false);
  });

  it('a bad link says which option and what to do, in the page’s words', () => {
    const r = readLink(new URLSearchParams('session=s&job=train&world=3&strategy=central&ps=2'), []);
    expect(r).toMatchObject({ kind: 'bad', problem: { field: 'ps', value: '2' } });
    expect(r.kind === 'bad' && r.problem.message).toMatch(/must be 1 with strategy central, which keeps every variable on one server/);
  });
});

describe('commHook: DDP’s communication hook (--comm-hook)', () => {
  it('reads none, fp16, bf16, powersgd:RANK[:START] and localsgd:H[:START] as the launcher passes them (kebab-case); START is 10 unless given', () => {
    expect(parse('world=2').commHook).toEqual({ kind: 'none' });
    expect(parse('world=2&comm-hook=none').commHook).toEqual({ kind: 'none' });
    expect(parse('world=2&comm-hook=fp16').commHook).toEqual({ kind: 'fp16' });
    expect(parse('world=2&commHook=bf16').commHook).toEqual({ kind: 'bf16' });
    expect(parse('world=2&comm-hook=powersgd:2').commHook).toEqual({ kind: 'powersgd', rank: 2, startIter: 10, wire: 'float32' });
    expect(parse('world=2&comm-hook=powersgd:4:0').commHook).toEqual({ kind: 'powersgd', rank: 4, startIter: 0, wire: 'float32' });
    // A last item fp16 / bf16: PowerSGD's all-reduces go 16-bit (torch's fp16_compress_wrapper).
    expect(parse('world=2&comm-hook=powersgd:2:fp16').commHook).toEqual({ kind: 'powersgd', rank: 2, startIter: 10, wire: 'float16' });
    expect(parse('world=2&comm-hook=powersgd:2:5:bf16').commHook).toEqual({ kind: 'powersgd', rank: 2, startIter: 5, wire: 'bfloat16' });
    expect(parse('world=4&min=2&comm-hook=localsgd:4').commHook).toEqual({ kind: 'localsgd', period: 4, startStep: 10 });
    expect(parse('world=2&comm-hook=localsgd:1:100').commHook).toEqual({ kind: 'localsgd', period: 1, startStep: 100 });
    // Empty is "not set", as for the other options.
    expect(parse('world=2&comm-hook=').commHook).toEqual({ kind: 'none' });
  });

  it('a link carries it only when set, START only when not the default, and parses back to itself', () => {
    expect(configParams(parse('world=2')).has('commHook')).toBe(false);
    expect(configParams(parse('world=2&comm-hook=none')).has('commHook')).toBe(false);
    expect(configParams(parse('world=2&comm-hook=powersgd:2:10')).get('commHook')).toBe('powersgd:2');
    expect(configParams(parse('world=2&comm-hook=localsgd:4:25')).get('commHook')).toBe('localsgd:4:25');
    for (const query of [
      'world=2&comm-hook=fp16',
      'world=2&comm-hook=bf16',
      'world=3&comm-hook=powersgd:3:50',
      'world=4&min=2&comm-hook=localsgd:8',
      'world=3&comm-hook=localsgd:2:0&slow=1:2',
    ]) {
      const config = parse(query);
      expect(parse(configParams(config).toString())).toEqual(config);
    }
    for (const text of [
      'none',
      'fp16',
      'bf16',
      'powersgd:1',
      'powersgd:2:0',
      'powersgd:2:fp16',
      'powersgd:4:0:bf16',
      'localsgd:4',
      'localsgd:4:11',
      'diloco:64',
      'diloco:16:0.5',
      'diloco:16:0.7:0',
      'diloco:8:fp16',
      'diloco:8:1:0.5:bf16',
      'diloco:16:stream4',
      'diloco:64:0.5:stream2:fp16',
      'diloco:64:int8',
      'diloco:128:stream4x8:int8',
    ]) {
      expect(formatCommHook(parseCommHook(text))).toBe(text);
    }
  });

  it("reads diloco:H[:OUTER_LR[:MOMENTUM]][:fp16|:bf16]: the paper's outer lr 0.7 and Nesterov momentum 0.9 unless given", () => {
    expect(parse('world=4&min=2&comm-hook=diloco:64').commHook).toEqual({
      kind: 'diloco',
      syncEvery: 64,
      outerLr: 0.7,
      outerMomentum: 0.9,
      wire: 'float32',
      stream: 0,
      overlap: 0,
    });
    expect(parse('world=2&comm-hook=diloco:16:1:0:fp16').commHook).toEqual({
      kind: 'diloco',
      syncEvery: 16,
      outerLr: 1,
      outerMomentum: 0,
      wire: 'float16',
      stream: 0,
      overlap: 0,
    });
    expect(parse('world=2&comm-hook=diloco:16:0.7:0.9:stream4:bf16').commHook).toEqual({
      kind: 'diloco',
      syncEvery: 16,
      outerLr: 0.7,
      outerMomentum: 0.9,
      wire: 'bfloat16',
      stream: 4,
      overlap: 1,
    });
    expect(parse('world=2&comm-hook=diloco:128:stream4x8').commHook).toMatchObject({ syncEvery: 128, stream: 4, overlap: 8 });
    expect(parse('world=2&comm-hook=diloco:64:stream4:int8').commHook).toMatchObject({ syncEvery: 64, stream: 4, wire: 'int8' });
    // int8 is DiLoCo's only: PowerSGD's low-rank factors keep fp16 or bf16.
    expect(refusal('world=2&comm-hook=powersgd:2:int8').message).toMatch(/powersgd/);
    expect(formatCommHook(parse('world=2&comm-hook=diloco:128:stream4x8').commHook)).toBe('diloco:128:stream4x8');
    expect(() => parse('world=2&comm-hook=diloco:64:stream4x16')).toThrow(
      errorOf(ConfigError, /D inner steps an all-reduce runs behind, from 1 to below H \/ P \(here 16\); "stream4x16" is not one/),
    );
    expect(refusal('world=2&comm-hook=diloco:16:stream9').message).toMatch(
      /streamP: P fragments from 1 to H \/ 2 \(here 8\), .*"stream9" is not one/,
    );
    expect(refusal('world=2&comm-hook=diloco:16:streamx').message).toMatch(/"streamx" is not one/);
    expect(refusal('world=2&comm-hook=diloco').message).toMatch(
      /^option commHook must be diloco:H with H a positive integer up to 1000000, the inner steps between two outer steps .*H is missing/,
    );
    expect(refusal('world=2&comm-hook=diloco:8:0').message).toMatch(
      /OUTER_LR a decimal number above 0 and up to 100 .*"0" is not one, got "diloco:8:0"$/,
    );
    expect(refusal('world=2&comm-hook=diloco:8:0.7:1').message).toMatch(/MOMENTUM a decimal number from 0 to below 1 .*"1" is not one/);
    expect(refusal('world=2&comm-hook=diloco:8:0.7:0.9:0.1').message).toMatch(/at most three numbers after diloco/);
    expect(refusal('world=2&pp=2&comm-hook=diloco:8')).toMatchObject({ option: 'commHook', value: 'diloco:8' });
  });

  it('is in the schema, outside the create form, with a label and a hint on the page', () => {
    const spec = TRAIN_OPTIONS.find((o) => o.name === 'commHook')!;
    expect(spec.inForm).toBe(false);
    expect(TRAIN_FORM_LABELS.commHook.label.length).toBeGreaterThan(0);
    expect(TRAIN_FORM_LABELS.commHook.hint).toMatch(/powersgd:RANK/);
    expect(TRAIN_FORM_LABELS.commHook.hint).toMatch(/localsgd:H/);
    expect(TRAIN_FORM_LABELS.commHook.hint).toMatch(/diloco:H/);
    expect(spec.defaultValue({})).toBe('none');
  });

  it('refuses a bad item naming it and what to write', () => {
    expect(refusal('world=2&comm-hook=fp32').message).toBe(
      'option commHook must be none, fp16, bf16, powersgd:RANK[:START][:fp16|:bf16], localsgd:H[:START] or diloco:H[:OUTER_LR[:MOMENTUM]][:streamP[xD]][:fp16|:bf16|:int8] (e.g. fp16, powersgd:2, powersgd:2:fp16, localsgd:4, diloco:64 or diloco:64:stream4); "fp32" is not a hook, got "fp32"',
    );
    expect(refusal('world=2&comm-hook=powersgd').message).toBe(
      'option commHook must be powersgd:RANK with RANK a positive integer up to 1024, the rank of the low-rank approximation (e.g. powersgd:2); RANK is missing, got "powersgd"',
    );
    expect(refusal('world=2&comm-hook=powersgd:0').message).toMatch(
      /^option commHook must be powersgd:RANK with RANK a positive integer up to 1024, .*; RANK "0" is not one, got "powersgd:0"$/,
    );
    expect(refusal('world=2&comm-hook=powersgd:1.5').message).toMatch(/RANK "1.5" is not one/);
    expect(refusal('world=2&comm-hook=powersgd:2000').message).toMatch(/RANK "2000" is not one/);
    expect(refusal('world=2&comm-hook=powersgd:2:-1').message).toBe(
      'option commHook must be powersgd:2:START with START an integer from 0 to 10000000, the steps of plain all-reduce before compression starts (e.g. powersgd:2:100); START "-1" is not one, got "powersgd:2:-1"',
    );
    expect(refusal('world=2&comm-hook=powersgd:2:fp32').message).toMatch(/START "fp32" is not one/);
    expect(refusal('world=2&comm-hook=powersgd:fp16').message).toMatch(/RANK "fp16" is not one/);
    expect(refusal('world=2&comm-hook=powersgd:2:3:4:fp16')).toMatchObject({
      name: 'ConfigError',
      option: 'commHook',
      value: 'powersgd:2:3:4:fp16',
    });
    expect(refusal('world=2&comm-hook=powersgd:2:fp16:bf16').message).toMatch(/START "fp16" is not one/);
    expect(refusal('world=2&comm-hook=powersgd:2:').message).toMatch(/START is missing/);
    expect(refusal('world=2&comm-hook=localsgd:0').message).toBe(
      'option commHook must be localsgd:H with H a positive integer up to 1000000, the steps between two averagings of the models (e.g. localsgd:4); H "0" is not one, got "localsgd:0"',
    );
    expect(refusal('world=2&comm-hook=localsgd:4:x').message).toMatch(
      /^option commHook must be localsgd:4:START with START an integer from 0 to 10000000, .*; START "x" is not one/,
    );
    expect(refusal('world=2&comm-hook=localsgd:1:2:3').message).toMatch(
      /^option commHook must be localsgd:H or localsgd:H:START .*at most two numbers after localsgd/,
    );
    expect(refusal('world=2&comm-hook=fp16:2').message).toBe('option commHook must be just fp16, without "2" after it, got "fp16:2"');
    // Beyond the syntax: the schema's own rule.
    expect(refusal('world=2&comm-hook=power sgd')).toMatchObject({ name: 'ConfigError', option: 'commHook', value: 'power sgd' });
    expect(refusal('world=2&comm-hook=PowerSGD:2').message).toMatch(/"PowerSGD" is not a hook/);
  });

  it('is DDP’s: refused with strategy ps or central, and with a pipeline (not supported yet)', () => {
    expect(refusal('world=3&strategy=ps&comm-hook=fp16').message).toBe(
      'option commHook must be none (or left out) with strategy ps: communication hooks replace DDP\'s all-reduce, and with parameter servers the workers push their gradients to the servers instead (leave out commHook, or strategy), got "fp16"',
    );
    expect(refusal('world=3&strategy=central&comm-hook=powersgd:1')).toMatchObject({ option: 'commHook', value: 'powersgd:1' });
    expect(refusal('world=2&pp=2&comm-hook=localsgd:4').message).toBe(
      'option commHook must be none (or left out) with pipeline stages (here pp 2): communication hooks with pipelines are not supported yet (leave out commHook, or pp), got "localsgd:4"',
    );
    // none is harmless anywhere.
    expect(parse('world=3&strategy=ps&comm-hook=none').commHook).toEqual({ kind: 'none' });
    expect(parse('world=2&pp=2&comm-hook=none').commHook).toEqual({ kind: 'none' });
  });

  it('a bad link names the field', () => {
    const r = readLink(new URLSearchParams('session=s&job=train&world=2&comm-hook=powersgd:0'), []);
    expect(r).toMatchObject({ kind: 'bad', problem: { field: 'commHook', value: 'powersgd:0' } });
  });
});

describe('timeLimit: stop after so many seconds', () => {
  it('reads seconds as the launcher passes them (--time-limit) or camelCase; none by default', () => {
    expect(parse('world=2').timeLimit).toBeNull();
    expect(parse('world=2&time-limit=60').timeLimit).toBe(60);
    expect(parse('world=4&strategy=ps&timeLimit=90').timeLimit).toBe(90);
    expect(parse('world=2&time-limit=0.5').timeLimit).toBe(0.5);
    // Empty is "not set", as for the other optional options.
    expect(parse('world=2&time-limit=').timeLimit).toBeNull();
  });

  it('refuses zero, negative, non-numeric and huge values, naming the option', () => {
    expect(refusal('world=2&time-limit=0').message).toBe('option timeLimit must be a number above 0 and at most 1000000, got "0"');
    expect(refusal('world=2&time-limit=-5')).toMatchObject({ name: 'ConfigError', option: 'timeLimit', value: '-5' });
    expect(refusal('world=2&time-limit=abc').option).toBe('timeLimit');
    expect(refusal('world=2&time-limit=Infinity').option).toBe('timeLimit');
    expect(refusal('world=2&time-limit=1e7').option).toBe('timeLimit');
  });

  it('is in the schema, outside the create form, with a label and a hint on the page; a link carries it only when set', () => {
    const spec = TRAIN_OPTIONS.find((o) => o.name === 'timeLimit')!;
    expect(spec.inForm).toBe(false);
    expect(TRAIN_FORM_LABELS.timeLimit.label).toMatch(/seconds/);
    expect(TRAIN_FORM_LABELS.timeLimit.hint?.length).toBeGreaterThan(20);
    expect(spec.defaultValue({})).toBeNull();
    expect(configParams(parse('world=2')).has('timeLimit')).toBe(false);
    const limited = parse('world=4&min=2&time-limit=45&strategy=central');
    expect(configParams(limited).get('timeLimit')).toBe('45');
    expect(parse(configParams(limited).toString())).toEqual(limited);
  });
});

describe('the schema bounds every size by the form’s', () => {
  it('world, min and max stop at 64', () => {
    expect(MAX_WORLD_SIZE).toBe(64);
    for (const name of ['world', 'min', 'max'])
      expect(TRAIN_OPTIONS.find((o) => o.name === name)!.kind).toEqual({ type: 'int', min: 1, max: 64 });
    expect(parse('world=64')).toMatchObject({ min: 64, max: 64 });
  });

  it('a link without min is a fixed size; only the form starts at 1', () => {
    expect(parse('world=4')).toMatchObject({ min: 4, max: 4 });
    expect(FORM_DEFAULTS.min).toBe(1);
  });
});

describe('readLink: every bad value of a link is named, with what is allowed and what to do', () => {
  const JOBS = ['rendezvous', 'allreduce', 'collectives'];
  const read = (query: string) => readLink(new URLSearchParams(query), JOBS);
  const problem = (query: string): LinkProblem => {
    const r = read(query);
    if (r.kind !== 'bad') throw new Error(`${query} was accepted as ${r.kind}`);
    return r.problem;
  };

  it('good links: the form, a training session, a launcher job, the lobby', () => {
    expect(read('')).toEqual({ kind: 'create' });
    expect(read('session=s&world=3&job=train&rank=2')).toMatchObject({
      kind: 'train',
      session: 's',
      rank: 2,
      timeoutMs: 3_600_000,
      config: { max: 3 },
    });
    expect(read('session=s&world=3&job=rendezvous')).toEqual({ kind: 'job', job: 'rendezvous', session: 's' });
    expect(read('session=s&world=3')).toEqual({ kind: 'lobby', session: 's', world: 3, rank: undefined });
  });

  it('world that is not a number, negative, or above 64', () => {
    expect(problem('session=s&job=train&world=abc')).toEqual({
      field: 'world',
      value: 'abc',
      title: 'This link is not valid',
      message: 'The link says “world=abc”, but the world size (how many tabs train together) must be an integer from 1 to 64.',
      action: 'Open the link exactly as it was shared (copy it again from whoever sent it), or create a new session on the start page.',
    });
    expect(problem('session=s&job=train&world=-2').message).toBe(
      'The link says “world=-2”, but the world size (how many tabs train together) must be an integer from 1 to 64.',
    );
    expect(problem('session=s&job=train&world=100').message).toBe(
      'The link says “world=100”, but the world size (how many tabs train together) must be an integer from 1 to 64.',
    );
    // The lobby (no job) refuses the same values in the same words.
    expect(problem('session=s&world=100').message).toBe(
      'The link says “world=100”, but the world size (how many tabs train together) must be an integer from 1 to 64.',
    );
  });

  it('a minimum above the world size', () => {
    expect(problem('session=s&job=train&world=3&min=5').message).toBe(
      "The link says “min=5”, but the minimum number of tabs must be at most the session's largest size (3).",
    );
  });

  it('job=train without a session, and an unknown job', () => {
    const p = problem('job=train&world=2');
    expect(p).toMatchObject({ field: 'session', value: null, title: 'This link has no session' });
    expect(p.message).toBe('The link asks for job=train but names no session (session=NAME).');
    expect(p.action).toMatch(/create a new session on the start page/);
    expect(problem('session=s&job=trian').message).toBe(
      'The link says “job=trian”, but the job must be one of train, rendezvous, allreduce, collectives.',
    );
  });

  it('a bad rank, a bad session name, any bad option', () => {
    expect(problem('session=s&job=train&world=3&rank=3').message).toBe(
      'The link says “rank=3”, but the rank must be an integer from 0 to 2 (this session has 3 ranks).',
    );
    expect(problem('session=s&job=train&world=3&rank=x').field).toBe('rank');
    expect(problem('session=s&world=3&rank=-1').field).toBe('rank');
    expect(problem('session=a%20b&job=train').message).toBe(
      'The link says “session=a b”, but the session must be 1 to 64 letters, digits, “-”, “_” or “.”.',
    );
    expect(problem('session=s&job=train&world=2&lr=0').message).toBe(
      'The link says “lr=0”, but the learning rate must be a number above 0 and at most 10.',
    );
    expect(problem('session=s&job=train&world=2&batch-size=0').message).toBe(
      'The link says “batchSize=0”, but the batch size per rank must be an integer from 1 to 4096.',
    );
    expect(problem('session=s&job=train&world=2&model=resnet').message).toBe(
      'The link says “model=resnet”, but the model must be one of mlp, cnn, lm, user.',
    );
    expect(problem('session=s&job=train&timeoutMs=5').field).toBe('timeoutMs');
  });
});

describe('devices: DataParallel Workers per tab (--devices)', () => {
  it('is 1 unless given, takes 1 to 16, and a link keeps it', () => {
    expect(parse('world=2').devices).toBe(1);
    expect(parse('world=2&devices=4').devices).toBe(4);
    expect(parse(configParams(parse('world=2&devices=3')).toString()).devices).toBe(3);
    expect(configParams(parse('world=2')).has('devices')).toBe(false);
    for (const bad of ['0', '17', '1.5', 'two'])
      expect(refusal(`world=2&devices=${bad}`).message).toBe(`option devices must be an integer from 1 to 16, got "${bad}"`);
  });

  it('is refused with parameter servers and pipelines, saying what to leave out', () => {
    expect(refusal('world=3&devices=2&strategy=ps').message).toMatch(
      /^option devices must be 1 \(or left out\) with strategy ps: .*leave out devices, or strategy/,
    );
    expect(refusal('world=2&devices=2&pp=2').message).toMatch(
      /^option devices must be 1 \(or left out\) with pipeline stages \(pp 2\): .*leave out devices, or pp/,
    );
    expect(parse('world=3&devices=1&strategy=central').devices).toBe(1);
  });
});

describe('hidden: the width of the model’s hidden dense layer (--hidden)', () => {
  it('is the model’s default unless given; the cnn takes 0 (none) and the mlp at least 1; a link keeps it', () => {
    expect(parse('world=2').hidden).toBeNull();
    expect(parse('world=2&model=cnn&hidden=128').hidden).toBe(128);
    expect(parse('world=2&model=cnn&hidden=0').hidden).toBe(0);
    expect(parse('world=2&hidden=512').hidden).toBe(512);
    const config = parse('world=2&model=cnn&hidden=1024');
    expect(parseTrainConfig((name) => configParams(config).get(name))).toEqual(config);
  });

  it('refuses a width the job cannot build, naming the option and what is allowed', () => {
    expect(() => parse('world=2&hidden=0')).toThrow(
      errorOf(ConfigError, /option hidden must be from 1 to 4096 for the mlp.*0, no hidden layer, is for the cnn/),
    );
    expect(() => parse('world=2&model=cnn&hidden=4097')).toThrow(
      errorOf(ConfigError, /option hidden must be an integer from 0 to 4096, got "4097"/),
    );
    expect(() => parse('world=2&model=cnn&hidden=-1')).toThrow(ConfigError);
    expect(() => parse('world=2&model=cnn&hidden=1.5')).toThrow(ConfigError);
  });
});
