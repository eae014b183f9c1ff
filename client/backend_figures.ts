/**
 * backend=auto's figures (client/train/backend_probe.ts measures them) and their words, for the
 * trainer's log and the dashboard's facts card alike.
 */
import type { BackendName } from '../src/jobs/train_config.ts';

/** One backend's figures: its time per step (the median of the timed steps), or why it has none. */
export interface ProbeFigure {
  backend: BackendName;
  /** null: no step finished within the budget, or the backend failed. */
  msPerStep: number | null;
  /** Steps timed after the first (which compiles: not counted unless it was all the budget allowed). */
  steps: number;
  /** Why there is no figure, or why it is rough (only the first step, compilation included). */
  note?: string;
  /** Wall time the probe spent on this backend, ms (its start, the model's building, the steps). */
  ms?: number;
  /** Whether the backend started (false: it failed to, or was not tried). */
  started?: boolean;
}

/** "cpu 182 ms/step (chosen) · wasm 431 ms/step · webgpu – (no step finished within 3 s: abandoned)". */
export function probeText(figures: readonly ProbeFigure[], chosen: BackendName): string {
  const ms = (v: number) => (v >= 1000 ? `${(v / 1000).toFixed(1)} s` : `${Math.round(v)} ms`);
  return figures
    .map(
      (f) =>
        `${f.backend} ${f.msPerStep === null ? '–' : `${ms(f.msPerStep)}/step`}${f.backend === chosen ? ' (chosen)' : ''}${f.note ? ` (${f.note})` : ''}`,
    )
    .join(' · ');
}
