/** The training job's one schema: the URL parser's defaults, its refusals, and links that round-trip. */
import { describe, expect, it } from 'vitest';
import { ConfigError, DEFAULT_LR, configParams, parseTrainConfig, urlOption } from '../client/train/config.ts';

const parse = (query: string) => {
  const params = new URLSearchParams(query);
  return parseTrainConfig((name) => urlOption(params, name));
};

describe('parseTrainConfig', () => {
  it('fills the defaults the README quotes; a fixed size is min = max = world', () => {
    expect(parse('world=3')).toEqual({
      model: 'mlp',
      dataset: 'mnist',
      batchSize: 64,
      lr: DEFAULT_LR.adam,
      optimizer: 'adam',
      epochs: 1,
      steps: null,
      trainSize: 0,
      seed: 0,
      shuffle: true,
      backend: 'webgpu',
      min: 3,
      max: 3,
      checkpointEvery: 0,
      evalEvery: 100,
      resumeFrom: null,
    });
    expect(DEFAULT_LR.adam).toBe(0.003);
  });

  it("takes kebab-case too, and the learning rate follows the optimizer's default", () => {
    expect(parse('world=2&batch-size=16&optimizer=sgd')).toMatchObject({ batchSize: 16, optimizer: 'sgd', lr: 0.05 });
    expect(parse('world=4&min=2&max=5')).toMatchObject({ min: 2, max: 5 });
  });

  it('refuses a bad value naming the option, the value and what is allowed', () => {
    const refusal = (query: string) => {
      try {
        parse(query);
      } catch (err) {
        return err as ConfigError;
      }
      throw new Error(`${query} was accepted`);
    };
    expect(refusal('world=abc').message).toBe('option world must be an integer from 1 to 64, got "abc"');
    expect(refusal('world=-2')).toMatchObject({ name: 'ConfigError', option: 'world', value: '-2' });
    expect(refusal('world=100').option).toBe('world');
    expect(refusal('world=2&lr=0').message).toBe('option lr must be a number above 0 and at most 10, got "0"');
    expect(refusal('world=2&model=resnet').message).toBe('option model must be one of mlp, cnn, got "resnet"');
    expect(refusal('world=2&min=3').message).toBe('option min must be at most the session\'s largest size (2), got "3"');
  });

  it('a config turned into link parameters parses back to itself', () => {
    const config = parse('world=4&min=2&dataset=synthetic&steps=50&trainSize=1024&optimizer=sgd&lr=0.1&seed=7');
    expect(parse(configParams(config).toString())).toEqual(config);
  });
});
