/**
 * Where an elastic run's steps spend their time on this rank: the user's step (compute, readback,
 * the gradients' collective, the optimizer), the model averaging (local SGD), the step-boundary
 * vote, the page's own work at the step's end (onStep, events, replica checks, checkpoints), and
 * the rest of the loop between two steps. The step's first step (kernels compile) and each
 * round's first step (links warm up) are left out, as torch's profilers skip warm-up steps.
 */

/** Mean ms per timed step, by phase; `total` is the wall time from one step's start to the next's. */
export interface StepTimeline {
  /** Steps timed (steps other than the run's and each round's first). */
  steps: number;
  /** The user's step function: compute, readback, the gradients' collective and the optimizer. */
  step: number;
  /** Local SGD's model averaging after the step (0 without it). */
  average: number;
  /** The step-boundary vote (one small all-gather; 0 on steps whose vote rode on the gradients' all-reduce). */
  vote: number;
  /** onStep, the step's events, replica checks and checkpoints: the page's work between steps. */
  page: number;
  /** Everything else in the loop: the batch's plan and the sampler. */
  other: number;
  total: number;
}

export type TimelinePhase = Exclude<keyof StepTimeline, 'steps' | 'total'>;

const PHASES: readonly TimelinePhase[] = ['step', 'average', 'vote', 'page', 'other'];

export class TimelineRecorder {
  private readonly sums: Record<TimelinePhase, number> = { step: 0, average: 0, vote: 0, page: 0, other: 0 };
  private timed = 0;
  private current: Record<TimelinePhase, number> | null = null;
  private stepStart = 0;
  private mark = 0;

  /** A step starts; `timed`: it counts (not a warm-up step). */
  begin(timed: boolean): void {
    const now = performance.now();
    this.current = timed ? { step: 0, average: 0, vote: 0, page: 0, other: 0 } : null;
    this.stepStart = now;
    this.mark = now;
  }

  /** The time since the last mark went to `phase`. */
  lap(phase: TimelinePhase): void {
    const now = performance.now();
    if (this.current) this.current[phase] += now - this.mark;
    this.mark = now;
  }

  /** The step is over (at the next step's start, or when the round ends): the rest is `other`. */
  end(): void {
    if (!this.current) return;
    const total = performance.now() - this.stepStart;
    const named = PHASES.reduce((s, p) => s + (p === 'other' ? 0 : this.current![p]), 0);
    this.current.other = Math.max(0, total - named);
    for (const p of PHASES) this.sums[p] += this.current[p];
    this.timed++;
    this.current = null;
  }

  /** Means per timed step (zeros before any). */
  read(): StepTimeline {
    const n = this.timed;
    const mean = (v: number) => (n > 0 ? v / n : 0);
    const out = { steps: n, total: 0 } as StepTimeline;
    for (const p of PHASES) {
      out[p] = mean(this.sums[p]);
      out.total += out[p];
    }
    return out;
  }
}
