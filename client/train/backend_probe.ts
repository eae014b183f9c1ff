/**
 * backend=auto: time a few training steps of the job's own model, at its batch, on each backend
 * the tab has, and keep the fastest. Which backend is fastest depends on the model as much as on
 * the machine: a small transformer takes 20-27 s a step on WebGPU through SwiftShader and well
 * under a second on the cpu backend of the same machine, while a GPU's WebGPU wins by far.
 *
 * Each backend gets a budget of time, not of steps: a step still running when its budget is
 * spent is abandoned (its readback left to finish on its own, its tensors disposed then), so a
 * 25 s step costs the probe its budget, not 25 s. On the cpu and wasm backends a step holds the
 * page's thread and cannot be cut short, and so does WebGL's shader compilation (37 s for the
 * language model's first step through SwiftShader, measured): such work is timed whole, and once
 * the probe has spent `totalMs` the backends not yet tried are skipped.
 *
 * Choosing a backend per tab keeps the group exact: the host optimizer applies the averaged
 * gradients with the same arithmetic on every backend (src/nn/optim.ts), as in any mixed fleet.
 */
import type { BackendName } from '../../src/jobs/train_config.ts';
import type { ProbeFigure } from '../backend_figures.ts';

export { probeText, type ProbeFigure } from '../backend_figures.ts';

/** A step of the job's model on the running backend, and how to free it. */
export interface ProbeModel {
  /** One training step: forward, backward, the gradients read back to the page. */
  step(): Promise<void>;
  dispose(): void;
}

export interface ProbeOptions {
  /** The backends to time, in this order (registered ones only). */
  candidates: readonly BackendName[];
  /** Starts a backend: undefined when it runs, else why not. */
  start(name: BackendName): Promise<string | undefined>;
  /** Builds the job's model and a batch on the running backend. */
  prepare(): Promise<ProbeModel>;
  /** Time each backend may take, its model's building included. */
  budgetMs: number;
  /** Timed steps after the first. */
  steps: number;
  /** Backends not started once the probe has taken this long (default 4 x budgetMs). */
  totalMs?: number;
  /** Why not to time `name`, given the figures so far; undefined: time it. */
  skip?(name: BackendName, figures: readonly ProbeFigure[]): string | undefined;
}

const LATE = Symbol('late');

/** `p`, or LATE once `deadline` (performance.now()) passes; p's rejection passes through. */
async function before<T>(p: Promise<T>, deadline: number): Promise<T | typeof LATE> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<typeof LATE>((r) => (timer = setTimeout(() => r(LATE), Math.max(0, deadline - performance.now()))));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Times the job's steps on one running backend within its budget. */
async function timeOne(name: BackendName, o: ProbeOptions): Promise<ProbeFigure> {
  const deadline = performance.now() + o.budgetMs;
  const seconds = `${Math.round(o.budgetMs / 100) / 10} s`;
  const building = o.prepare();
  const model = await before(building, deadline);
  if (model === LATE) {
    void building.then(
      (m) => m.dispose(),
      () => {},
    );
    return { backend: name, msPerStep: null, steps: 0, note: `the model was not built within ${seconds}: abandoned` };
  }
  const times: number[] = [];
  let first: number | null = null;
  let pending: Promise<void> | undefined;
  try {
    for (let i = 0; i <= o.steps && performance.now() < deadline; i++) {
      const t0 = performance.now();
      const step = model.step();
      if ((await before(step, deadline)) === LATE) {
        pending = step;
        break;
      }
      if (i === 0) first = performance.now() - t0;
      else times.push(performance.now() - t0);
    }
  } catch (err) {
    model.dispose();
    return { backend: name, msPerStep: null, steps: 0, note: `it cannot train this model: ${(err as Error).message}` };
  }
  // An abandoned step still reads its gradients back: free the model once it is done.
  if (pending)
    void pending.then(
      () => model.dispose(),
      () => model.dispose(),
    );
  else model.dispose();
  if (times.length > 0) return { backend: name, msPerStep: median(times), steps: times.length };
  if (first !== null)
    return {
      backend: name,
      msPerStep: first,
      steps: 0,
      note: `only its first step fit in ${seconds} (a first step includes any compilation)`,
    };
  return { backend: name, msPerStep: null, steps: 0, note: `no step finished within ${seconds}: abandoned` };
}

/**
 * Times every candidate and returns the fastest with every figure; `chosen` is null when no
 * backend finished a step (the caller falls back to its usual order). Leaves the last
 * candidate tried running: the caller starts the chosen one.
 */
export async function probeBackends(o: ProbeOptions): Promise<{ chosen: BackendName | null; figures: ProbeFigure[] }> {
  const figures: ProbeFigure[] = [];
  const t0 = performance.now();
  const totalMs = o.totalMs ?? 4 * o.budgetMs;
  for (const name of o.candidates) {
    const skipped =
      performance.now() - t0 >= totalMs ? `the probe had used its ${Math.round(totalMs / 100) / 10} s` : o.skip?.(name, figures);
    if (skipped !== undefined) {
      figures.push({ backend: name, msPerStep: null, steps: 0, note: `not timed: ${skipped}`, started: false });
      continue;
    }
    const started = performance.now();
    const failure = await o.start(name);
    const figure = failure !== undefined ? { backend: name, msPerStep: null, steps: 0, note: failure } : await timeOne(name, o);
    figures.push({ ...figure, ms: Math.round(performance.now() - started), started: failure === undefined });
  }
  const timed = figures.filter((f) => f.msPerStep !== null);
  const best = timed.reduce<ProbeFigure | null>((a, f) => (a === null || f.msPerStep! < a.msPerStep! ? f : a), null);
  return { chosen: best?.backend ?? null, figures };
}

/** webgl is timed only where webgpu does not start (its reasons: client/train/backend.ts, PROBE_ORDER). */
export function skipWebgl(name: BackendName, figures: readonly ProbeFigure[]): string | undefined {
  if (name !== 'webgl' || !figures.some((f) => f.backend === 'webgpu' && f.started)) return undefined;
  return 'WebGPU runs on this adapter (WebGL is timed only where it does not)';
}
