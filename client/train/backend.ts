/**
 * Chooses the TF.js backend: the one the URL asks for, falling back (webgpu -> webgl -> cpu) with
 * the reason when it cannot start; or, with `auto`, the fastest for this job's model, measured
 * (backend_probe.ts).
 */
import * as tf from '@tensorflow/tfjs';
import '@tensorflow/tfjs-backend-webgpu';
import '../../src/runtime/wasm_paths.ts';
import { classificationLoss, fetchBatch, type Dataset } from '../../src/index.ts';
import { startBackend } from '../../src/runtime/device.ts';
import { BACKENDS, type BackendName, type BackendSetting } from '../../src/jobs/train_config.ts';
import { INSECURE_PAGE_REASON, missingWebGpuReason } from '../webgpu.ts';
import { noBackendError } from './preflight.ts';
import { probeBackends, probeText, skipWebgl, type ProbeFigure, type ProbeModel } from './backend_probe.ts';

export interface BackendChoice {
  backend: BackendName;
  /** Why the backend asked for is not the one running, if it is not. */
  fallbackReason?: string;
  /** backend=auto: every backend's measured time per step of the job's model (the chosen one is `backend`). */
  probe?: ProbeFigure[];
}

async function tryBackend(name: BackendName): Promise<string | undefined> {
  if (name === 'webgpu') {
    const missing = missingWebGpuReason();
    if (missing !== undefined) return missing;
  }
  return startBackend(name);
}

/** `wanted`, or the first of its fallbacks that starts. `auto` starts as webgpu would until `chooseFastest` measures. */
export async function selectBackend(wanted: BackendSetting): Promise<BackendChoice> {
  if (wanted === 'auto') return selectBackend('webgpu');
  if (!(BACKENDS as readonly string[]).includes(wanted)) throw new Error(`unknown backend "${wanted}"; use auto, ${BACKENDS.join(', ')}`);
  const reasons: string[] = [];
  const order = [
    wanted,
    ...(['webgpu', 'webgl', 'cpu'] as BackendName[]).filter((b) => b !== wanted && BACKENDS.indexOf(b) > BACKENDS.indexOf(wanted)),
  ];
  for (const name of order) {
    const failure = await tryBackend(name);
    if (failure === undefined) {
      if (name === wanted) return { backend: name };
      // Plain http from another machine: say it is the page, not the browser, and how to get WebGPU.
      if (reasons[0] === INSECURE_PAGE_REASON) {
        return {
          backend: name,
          fallbackReason: `${INSECURE_PAGE_REASON}. This tab trains on ${name} meanwhile; to use WebGPU, open the session over https (see docs/deployment.md, “Across machines”)`,
        };
      }
      return { backend: name, fallbackReason: `${reasons.join('; ')}; using ${name} instead` };
    }
    reasons.push(failure);
  }
  // Said in plain words; the tab has not joined the group yet, so the others train on without it.
  throw noBackendError(reasons);
}

/** Each backend's budget: a few steps of a fast model, the first step (compilation) of a slow one, never a 25 s step. */
export const PROBE_BUDGET_MS = 3000;
/** Timed steps after the first, within the budget. */
export const PROBE_STEPS = 3;
/**
 * Timed in this order: webgpu first, the likely winner on a machine with a GPU, whose slow steps
 * can be abandoned (they run off the page's thread); then the CPU backends, whose steps hold the
 * thread; webgl last, and only where WebGPU does not start: on the same adapter WebGPU is TF.js's
 * faster backend, and WebGL's shader compilation holds the page (37 s for the language model's
 * first step through SwiftShader, measured) where nothing can abandon it.
 */
const PROBE_ORDER: readonly BackendName[] = ['webgpu', 'cpu', 'wasm', 'webgl'];

/**
 * backend=auto: a few training steps of the job's model (`newModel`) at its batch (`batchSize`
 * samples of `data`) on every backend this tab has, the fastest kept and started. Every figure
 * is in the choice (the dashboard and the job's report show them). When no backend finished a
 * step, `fallback` (the usual order's choice) is kept, saying so.
 */
export async function chooseFastest(
  newModel: () => Promise<tf.LayersModel>,
  data: Dataset,
  batchSize: number,
  fallback: BackendChoice,
): Promise<BackendChoice> {
  const n = Math.max(1, Math.min(batchSize, data.length));
  const { x, y } = await fetchBatch(
    data,
    Array.from({ length: n }, (_, i) => i),
  );
  const prepare = async (): Promise<ProbeModel> => {
    const model = await newModel();
    const xs = tf.tensor(x, [n, ...data.inputShape]);
    const ys = tf.tensor(y, [n, ...(data.targetShape ?? [])], 'int32');
    const variables = model.trainableWeights.map((w) => w.read() as tf.Variable);
    return {
      async step() {
        // The ops are issued here, at once; only the readback waits (and may be abandoned).
        const { value, grads } = tf.variableGrads(
          () => classificationLoss(model.apply(xs, { training: true }) as tf.Tensor, ys, data.numClasses),
          variables,
        );
        const all = [value, ...Object.values(grads)];
        try {
          await Promise.all(all.map((t) => t.data()));
        } finally {
          tf.dispose(all);
        }
      },
      dispose() {
        tf.dispose([xs, ys]);
        model.dispose();
      },
    };
  };
  const candidates = PROBE_ORDER.filter((b) => tf.findBackendFactory(b) !== null);
  const { chosen, figures } = await probeBackends({
    candidates,
    start: tryBackend,
    prepare,
    budgetMs: PROBE_BUDGET_MS,
    steps: PROBE_STEPS,
    skip: skipWebgl,
  });
  const name = chosen ?? fallback.backend;
  const failure = await tryBackend(name);
  if (failure !== undefined) throw noBackendError([`${name} was the fastest, and then failed to start: ${failure}`]);
  if (chosen === null)
    return {
      ...fallback,
      fallbackReason: `no backend finished a step of this model in ${PROBE_BUDGET_MS / 1000} s (${probeText(figures, name)}); using ${name}`,
      probe: figures,
    };
  return { backend: name, probe: figures };
}
