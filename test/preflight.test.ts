/**
 * A tab that cannot take part is told why before it joins anything (client/train/preflight.ts):
 * no WebRTC with other tabs to talk to, too little memory for the job, no backend that computes.
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { buildModel } from '../src/nn/models.ts';
import { parseTrainConfig, type TrainConfig } from '../src/jobs/train_config.ts';
import { CannotTrainError, MEMORY_SHARE, memoryNeedBytes, modelSize, noBackendError, preflight } from '../client/train/preflight.ts';

function config(options: Record<string, string> = {}): TrainConfig {
  return parseTrainConfig((name) => options[name] ?? null);
}

const ABLE = { webrtc: true, deviceMemoryGB: 8 };

describe('modelSize', () => {
  beforeAll(async () => {
    await tf.setBackend('cpu');
  });

  it.each([
    ['mlp', 'mnist', null],
    ['mlp', 'synthetic', null],
    ['mlp', 'mnist', 512],
    ['mlp', 'synthetic', 7],
    ['cnn', 'mnist', null],
    ['cnn', 'mnist', 128],
  ] as const)('%s on %s (hidden %s) counts the parameters src/nn/models.ts builds', (model, dataset, hidden) => {
    const c = config({ model, dataset, ...(hidden === null ? {} : { hidden: String(hidden) }) });
    const shape = dataset === 'mnist' ? { inputShape: [28, 28, 1], numClasses: 10 } : { inputShape: [16], numClasses: 4 };
    const built = buildModel({ kind: model, ...shape, seed: 0, ...(c.hidden === null ? {} : { hidden: c.hidden }) });
    expect(modelSize(c).parameters).toBe(built.countParams());
    built.dispose();
  });

  it('counts the usual MNIST CNN as the README does', () => {
    expect(modelSize(config({ model: 'cnn', dataset: 'mnist' })).parameters).toBe(5_258);
    expect(modelSize(config({ model: 'cnn', dataset: 'mnist', hidden: '128' })).parameters).toBe(53_866);
  });
});

describe('preflight', () => {
  it('lets a tab with WebRTC and memory enough take part', () => {
    expect(preflight(config({ world: '4', dataset: 'mnist' }), ABLE)).toBeNull();
    // Browsers other than Chromium do not say their memory: nothing to check.
    expect(preflight(config({ world: '4', dataset: 'mnist' }), { webrtc: true, deviceMemoryGB: null })).toBeNull();
  });

  it('refuses a tab without WebRTC when there are other tabs, in plain words', () => {
    const refusal = preflight(config({ world: '3' }), { webrtc: false, deviceMemoryGB: null, browser: 'Old Browser 9' });
    expect(refusal).toBeInstanceOf(CannotTrainError);
    expect(refusal!.title).toBe('This browser cannot join the training');
    expect(refusal!.message).toContain('This browser (Old Browser 9) has no WebRTC');
    expect(refusal!.message).toContain('the other tabs train on without it');
    expect(refusal!.action).toMatch(/Chrome, Edge, Firefox or Safari/);
    // A session of one tab alone needs no WebRTC.
    expect(preflight(config({ world: '1' }), { webrtc: false, deviceMemoryGB: null })).toBeNull();
    // An elastic session that may grow past one tab does.
    expect(preflight(config({ world: '2', min: '1' }), { webrtc: false, deviceMemoryGB: null })).not.toBeNull();
  });

  it('refuses a device far too small for the job, and only then', () => {
    const mnist = config({ world: '2', dataset: 'mnist' });
    // MNIST is held whole as float32: about 270 MB with everything else.
    expect(memoryNeedBytes(mnist)).toBeGreaterThan(256 * 2 ** 20);
    expect(memoryNeedBytes(mnist)).toBeLessThan(512 * 2 ** 20);
    const refusal = preflight(mnist, { webrtc: true, deviceMemoryGB: 0.25 })!;
    expect(refusal.title).toBe('Not enough memory on this device');
    expect(refusal.message).toMatch(/needs about [\d,]+ MB/);
    expect(refusal.message).toContain('reports 0.25 GB');
    expect(refusal.message).toContain("the model's 101,770 parameters");
    expect(refusal.action).toMatch(/smaller job/);
    // A phone of 1 GB has room for it; the synthetic job fits anywhere.
    expect(preflight(mnist, { webrtc: true, deviceMemoryGB: 1 })).toBeNull();
    expect(preflight(config({ world: '2', dataset: 'synthetic' }), { webrtc: true, deviceMemoryGB: 0.25 })).toBeNull();
  });

  it("counts the model, its copies per device and the batch's activations", () => {
    const small = memoryNeedBytes(config({ dataset: 'synthetic' }));
    const wide = memoryNeedBytes(config({ dataset: 'synthetic', hidden: '4096' }));
    expect(wide - small).toBeGreaterThan((16 * 4096 + 4096 * 4) * 4 * 10);
    expect(memoryNeedBytes(config({ dataset: 'synthetic', hidden: '4096', devices: '4' }))).toBeGreaterThan(wide);
    expect(memoryNeedBytes(config({ model: 'cnn', dataset: 'mnist', batchSize: '4096' }))).toBeGreaterThan(
      memoryNeedBytes(config({ model: 'cnn', dataset: 'mnist', batchSize: '64' })) + 256 * 2 ** 20,
    );
    // The budget is a share of what the device reports.
    const need = memoryNeedBytes(config({ model: 'cnn', dataset: 'mnist', batchSize: '4096', world: '2' }));
    const justEnough = need / 2 ** 30 / MEMORY_SHARE;
    expect(
      preflight(config({ model: 'cnn', dataset: 'mnist', batchSize: '4096', world: '2' }), { webrtc: true, deviceMemoryGB: justEnough }),
    ).toBeNull();
    expect(
      preflight(config({ model: 'cnn', dataset: 'mnist', batchSize: '4096', world: '2' }), {
        webrtc: true,
        deviceMemoryGB: justEnough * 0.99,
      }),
    ).not.toBeNull();
  });

  it('says plainly when no backend computes', () => {
    const e = noBackendError(['the webgpu backend failed to start', 'the cpu backend computed a sum of 4096 twos as 0']);
    expect(e).toBeInstanceOf(CannotTrainError);
    expect(e.title).toBe('This browser cannot run the model');
    expect(e.message).toContain('the cpu backend computed a sum of 4096 twos as 0');
    expect(e.message).toContain('the other tabs train on without it');
  });
});
