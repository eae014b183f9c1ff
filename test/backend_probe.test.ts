/**
 * backend=auto's timing (client/train/backend_probe.ts): real training steps of a real model on
 * TF.js's cpu backend for every candidate; the slow backend's step is one whose readback does not
 * come back within the budget (a GPU's, 25 s a step through SwiftShader), held open by the test
 * so that the probe must abandon it rather than wait. The fastest backend with a figure is
 * chosen, a failing or slow one says why it has none, and every tensor is freed, the abandoned
 * step's once its readback ends.
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { buildLanguageModel } from '../src/nn/language_model.ts';
import { classificationLoss } from '../src/nn/losses.ts';
import { probeBackends, probeText, skipWebgl, type ProbeModel } from '../client/train/backend_probe.ts';
import type { BackendName } from '../src/jobs/train_config.ts';

beforeAll(async () => {
  await tf.setBackend('cpu');
});

/** A real training step of a small language model: forward, backward, the gradients read back; `hold` delays the readback's end. */
function realModel(hold?: Promise<void>): ProbeModel {
  const model = buildLanguageModel({ vocabSize: 20, contextLength: 8, dModel: 16, heads: 2, blocks: 1, seed: 1 });
  const xs = tf.randomUniform([4, 8], 0, 19, 'int32');
  const ys = tf.randomUniform([4, 8], 0, 19, 'int32');
  const variables = model.trainableWeights.map((w) => w.read() as tf.Variable);
  return {
    async step() {
      const { value, grads } = tf.variableGrads(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, 20), variables);
      const all = [value, ...Object.values(grads)];
      try {
        await Promise.all(all.map((t) => t.data()));
        if (hold) await hold;
      } finally {
        tf.dispose(all);
      }
    },
    dispose() {
      tf.dispose([xs, ys]);
      model.dispose();
    },
  };
}

describe('backend=auto', () => {
  it('chooses the fastest backend that finished steps; abandons a step past its budget; says why a backend has no figure; frees every tensor', async () => {
    const before = tf.memory().numTensors;
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let running: BackendName = 'cpu';
    const { chosen, figures } = await probeBackends({
      candidates: ['cpu', 'wasm', 'webgl', 'webgpu'],
      totalMs: 60_000,
      start: async (name) => {
        if (name === 'webgl') return 'the webgl backend failed to start';
        running = name;
        return undefined;
      },
      prepare: async () => {
        if (running === 'wasm') {
          const m = realModel();
          return { step: () => Promise.reject(new Error('kernel Conv2DBackpropFilter is not in this backend')), dispose: m.dispose };
        }
        // webgpu: the first step's readback stays pending until the test releases it.
        return realModel(running === 'webgpu' ? held : undefined);
      },
      budgetMs: 1500,
      steps: 2,
    });
    expect(chosen).toBe('cpu');
    expect(figures.map((f) => f.backend)).toEqual(['cpu', 'wasm', 'webgl', 'webgpu']);
    expect(figures[0]!.msPerStep).toBeGreaterThan(0);
    expect(figures[1]).toMatchObject({
      backend: 'wasm',
      msPerStep: null,
      steps: 0,
      note: 'it cannot train this model: kernel Conv2DBackpropFilter is not in this backend',
    });
    expect(figures[2]).toMatchObject({ backend: 'webgl', msPerStep: null, steps: 0, note: 'the webgl backend failed to start' });
    expect(figures[3]).toMatchObject({ backend: 'webgpu', msPerStep: null, steps: 0, note: 'no step finished within 1.5 s: abandoned' });
    // The abandoned backend cost its budget, not its step (which has not ended yet).
    expect(figures[3]!.ms).toBeGreaterThanOrEqual(1400);
    expect(probeText(figures, 'cpu')).toMatch(
      /^cpu [\d.]+ m?s\/step \(chosen\).* · wasm – \(it cannot train this model: .*\) · webgl – \(the webgl backend failed to start\) · webgpu – \(no step finished within 1\.5 s: abandoned\)$/,
    );

    // The abandoned step still holds its model until its readback ends; then nothing is left.
    expect(tf.memory().numTensors).toBeGreaterThan(before);
    release();
    await held;
    await new Promise((r) => setTimeout(r, 0));
    expect(tf.memory().numTensors).toBe(before);
  }, 60_000);

  it('no backend finishing a step chooses none, and a slower one with figures loses to a faster', async () => {
    const none = await probeBackends({
      candidates: ['cpu'],
      start: async () => 'no',
      prepare: async () => realModel(),
      budgetMs: 100,
      steps: 1,
    });
    expect(none).toMatchObject({ chosen: null, figures: [{ backend: 'cpu', msPerStep: null, steps: 0, note: 'no' }] });

    // Once the probe has used its total, the backends left are not started.
    const started: string[] = [];
    const capped = await probeBackends({
      candidates: ['cpu', 'webgpu'],
      start: async (name) => {
        started.push(name);
        return undefined;
      },
      prepare: async () => realModel(),
      budgetMs: 5000,
      steps: 1,
      totalMs: 1,
    });
    expect(started).toEqual(['cpu']);
    expect(capped.chosen).toBe('cpu');
    expect(capped.figures[1]).toEqual({
      backend: 'webgpu',
      msPerStep: null,
      steps: 0,
      note: 'not timed: the probe had used its 0 s',
      started: false,
    });

    // webgl only where webgpu does not start: its shader compilation cannot be abandoned.
    const tried: string[] = [];
    const gl = async (webgpuStarts: boolean) =>
      probeBackends({
        candidates: ['webgpu', 'webgl'],
        start: async (name) => {
          tried.push(name);
          return name === 'webgpu' && !webgpuStarts ? 'no WebGPU adapter' : undefined;
        },
        prepare: async () => realModel(),
        budgetMs: 5000,
        steps: 1,
        skip: skipWebgl,
      });
    expect((await gl(true)).figures[1]).toEqual({
      backend: 'webgl',
      msPerStep: null,
      steps: 0,
      note: 'not timed: WebGPU runs on this adapter (WebGL is timed only where it does not)',
      started: false,
    });
    expect(tried).toEqual(['webgpu']);
    expect((await gl(false)).chosen).toBe('webgl');
    expect(tried).toEqual(['webgpu', 'webgpu', 'webgl']);

    // The same real model; on "wasm" each step also waits 300 ms for its readback: cpu wins.
    let running: BackendName = 'cpu';
    const delay = () => new Promise<void>((r) => setTimeout(r, 300));
    const { chosen, figures } = await probeBackends({
      candidates: ['wasm', 'cpu'],
      start: async (name) => {
        running = name;
        return undefined;
      },
      prepare: async () => {
        const m = realModel();
        return running === 'wasm'
          ? {
              step: async () => {
                await m.step();
                return await delay();
              },
              dispose: m.dispose,
            }
          : m;
      },
      budgetMs: 5000,
      steps: 2,
    });
    expect(chosen).toBe('cpu');
    expect(figures[0]!.msPerStep!).toBeGreaterThan(figures[1]!.msPerStep!);
  }, 60_000);
});
