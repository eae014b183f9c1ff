/**
 * Where runElastic's replicas that train apart meet again. Local SGD (`modelAverager`, torch's
 * PostLocalSGDOptimizer, with the `postLocalSGD` hook): after each committed step the replicas'
 * weights are averaged at the averager's steps. DiLoCo (`diloco`, see parallel/diloco/): inner
 * steps communicate nothing, and an outer step follows every H-th committed step. Either way a
 * run that ends between two meetings meets once more at its end, so that every rank ends with
 * the same model; and DiLoCo keeps the last step every rank is known to have finished, which a
 * failed round goes back to.
 */
import type * as tf from '@tensorflow/tfjs';
import { PeriodicModelAverager, type PeriodicModelAveragerOptions } from '../comm_hooks/local_sgd.ts';
import { DiLoCo, type DiLoCoHeld, type DiLoCoOptions } from '../diloco/diloco.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { Progress, TrainState } from '../../checkpoint/state_dict.ts';
import type { AggregationReport } from '../robust/reducer.ts';
import type { ContributionOf } from './contributions.ts';
import type { DeviceGuard } from './device_guard.ts';

export class LocalSteps {
  readonly averager: PeriodicModelAverager | undefined;
  /** DiLoCo (`o.diloco`): also this rank's hook. */
  readonly diloco: DiLoCo | undefined;
  /**
   * DiLoCo: the last step every rank is known to have finished (its vote, or an outer step,
   * completed), with this rank's progress and weights then. Inner steps communicate nothing, so a
   * step committed here may be one a lost rank never took: a failed round goes back to this one.
   */
  private confirmed: { progress: Progress; held: DiLoCoHeld } | null = null;
  /** The step after which averageAtEnd averaged (once per step, whichever end comes first). */
  private averagedAtEnd = -1;

  constructor(
    o: { modelAverager?: PeriodicModelAveragerOptions; diloco?: DiLoCoOptions },
    private readonly guard: DeviceGuard,
    /** Tells a robust aggregation's judgments (DiLoCo's outer steps). */
    private readonly tell: (of: ContributionOf, report: AggregationReport | null | undefined) => void,
  ) {
    this.averager = o.modelAverager ? new PeriodicModelAverager(o.modelAverager) : undefined;
    this.diloco = o.diloco ? new DiLoCo(o.diloco) : undefined;
  }

  /** After a committed step: local SGD averages (true when it did), DiLoCo lands the outer all-reduces due. */
  async afterStep(pg: ProcessGroup, model: tf.LayersModel, step: number, lap: () => void): Promise<boolean> {
    let averaged = false;
    if (this.averager) {
      this.guard.activity = `the model averaging after step ${step}`;
      averaged = await this.guard.whileLives(this.averager.average(pg, model, step));
      lap();
    }
    if (this.diloco) {
      this.guard.activity = `DiLoCo's outer all-reduces due at step ${step}`;
      await this.guard.whileLives(this.diloco.land(model, step));
      lap();
    }
    return averaged;
  }

  /**
   * A run that ends (or is stopped) between two meetings meets once more, so that it ends with
   * one model on every rank, as plain DDP does (torch's PostLocalSGDOptimizer leaves that to the
   * script). Every rank gets here after the same step.
   */
  async atEnd(pg: ProcessGroup, state: TrainState): Promise<void> {
    const step = state.progress.step;
    if (this.diloco && !this.diloco.inSync(step)) {
      this.guard.activity = `DiLoCo's last outer step, after step ${step}`;
      await this.guard.whileLives(this.diloco.syncNow(pg, state.model, step));
      this.tell('pseudo-gradients', this.diloco.lastAggregation);
      return;
    }
    if (!this.averager || step <= this.averager.warmupSteps || this.averager.averagesAt(step) || this.averagedAtEnd === step) return;
    this.guard.activity = `the final model averaging after step ${step}`;
    await this.guard.whileLives(this.averager.averageNow(pg, state.model));
    this.averagedAtEnd = step;
  }

  /** DiLoCo: every rank has finished the step committed last (its vote or outer step completed): the point a failed round goes back to. */
  async confirm(state: TrainState): Promise<void> {
    if (!this.diloco) return;
    this.confirmed = {
      progress: { ...state.progress },
      held: await this.guard.whileLives(this.diloco.hold(state.model, state.progress.step)),
    };
  }

  /**
   * DiLoCo, before a round's state transfer: a step committed here after the last confirmed one
   * (its vote failed) may be one that a lost rank never took, its samples trained by nobody. This
   * rank goes back to the confirmed step (it claims that step, with the next one in flight, so
   * that the next round trains it again: `inFlight`) and offers the weights it had then to the
   * round's outer step (`held`).
   */
  backToConfirmed(state: TrainState): { held: DiLoCoHeld | null; inFlight?: number } {
    const c = this.confirmed;
    if (!c) return { held: null };
    if (c.progress.step < state.progress.step) {
      Object.assign(state.progress, c.progress);
      return { held: c.held, inFlight: c.progress.step + 1 };
    }
    return { held: c.held };
  }
}
