/**
 * TensorFlow's CentralStorageStrategy across tabs: one server holds every variable (a
 * ParameterServerShard of the whole model, K = 1), and training is synchronous. Step t is the
 * shard's version t: every worker pulls version t, computes the gradients of its share of the
 * global batch, and pushes them for step t; once all `numWorkers` have (only then), the server
 * averages them and applies the average once, which makes version t + 1.
 *
 * The average is deterministic whatever order the pushes arrive in: it is summed in worker-id
 * order in float32 and divided once by the number of workers, as DDP's ring average is
 * (bit-identical to it for two workers, where the sum's order cannot differ). With SGD, W
 * workers at batch B so train to the weights of DDP, and of one rank at batch W x B up to float
 * rounding. Pushes are folded into the sum as soon as every lower worker's has been, so pushes
 * that arrive in order are never copied.
 *
 * A push for another step than the one being collected, or a second one from a worker, is
 * refused with SyncPushError (thrown: the transport must not send it; a 'past-step' one is a
 * retransmission it can ignore).
 */
import type { ParameterServerShard } from './shard.ts';
import { allFinite } from '../../wire/finite.ts';

export type SyncRefusal =
  /** The worker id is not an integer in [0, numWorkers). */
  | 'bad-worker'
  /** The step is before the one being collected (already applied: a retransmission). */
  | 'past-step'
  /** The step is after the one being collected (its version was never pulled here). */
  | 'future-step'
  /** This worker already pushed for this step. */
  | 'twice'
  /** The gradients are not a Float32Array of the shard's length. */
  | 'bad-length'
  /** The gradients hold a NaN or an infinity (not kept: the worker may push again for the step). */
  | 'nonfinite';

/** A push the synchronous accumulator refuses; nothing of it was kept. */
export class SyncPushError extends Error {
  override name = 'SyncPushError';
  constructor(
    readonly reason: SyncRefusal,
    readonly worker: number,
    readonly step: number,
    /** The step being collected. */
    readonly expectedStep: number,
    message: string,
  ) {
    super(message);
  }
}

export type SyncResult =
  /** Kept; the step waits for `missing` (worker ids, ascending). */
  | { status: 'waiting'; step: number; arrived: number; missing: number[] }
  /** This push completed the step: `average` was applied once; `version` is the new version (the next step). */
  | { status: 'applied'; step: number; version: number; average: Float32Array; checkpointDue: boolean };

export interface CentralStorageOptions {
  /** Workers whose gradients every step waits for; ids 0 .. numWorkers - 1. */
  numWorkers: number;
}

export class CentralStorageAccumulator {
  readonly numWorkers: number;
  /** Running float32 sum of workers 0 .. next - 1 (allocated per step: the average handed out is this array). */
  private sum: Float32Array | null = null;
  /** Pushes of workers >= next, copied, waiting for the lower ones. */
  private pending: Array<Float32Array | null>;
  private arrived: boolean[];
  private count = 0;
  private next = 0;
  private stepsApplied = 0;
  private readonly pushes: number[];

  constructor(
    readonly shard: ParameterServerShard,
    options: CentralStorageOptions,
  ) {
    const n = options.numWorkers;
    if (!Number.isSafeInteger(n) || n < 1) throw new RangeError(`numWorkers must be a positive integer, got ${n}`);
    this.numWorkers = n;
    this.pending = new Array<Float32Array | null>(n).fill(null);
    this.arrived = new Array<boolean>(n).fill(false);
    this.pushes = new Array<number>(n).fill(0);
  }

  /** The step being collected: the shard's version, which every worker of it pulled. */
  get step(): number {
    return this.shard.version;
  }

  /** Worker ids whose push for the current step has not arrived, ascending. */
  missing(): number[] {
    return this.arrived.flatMap((a, w) => (a ? [] : [w]));
  }

  /**
   * Takes worker `worker`'s gradients (flat, shard order) for `step`. Returns 'waiting' until
   * every worker's have arrived; the push that completes the step averages them (worker order,
   * float32, divided once), applies the average, and returns it. Throws SyncPushError for a push
   * it refuses (and keeps nothing of it).
   */
  add(worker: number, step: number, grads: Float32Array): SyncResult {
    const expected = this.step;
    const refuse = (reason: SyncRefusal, why: string) =>
      new SyncPushError(reason, worker, step, expected, `step ${expected} refuses a push of worker ${worker} for step ${step}: ${why}`);
    if (!Number.isSafeInteger(worker) || worker < 0 || worker >= this.numWorkers)
      throw refuse('bad-worker', `worker ids are integers in [0, ${this.numWorkers})`);
    if (step !== expected) {
      if (Number.isSafeInteger(step) && step < expected) throw refuse('past-step', `step ${step} was already applied (a retransmission?)`);
      throw refuse('future-step', `only step ${expected} is being collected; pull its parameters first`);
    }
    if (this.arrived[worker]) throw refuse('twice', 'this worker already pushed for this step');
    if (!(grads instanceof Float32Array) || grads.length !== this.shard.numel) {
      throw refuse(
        'bad-length',
        `${grads instanceof Float32Array ? `${grads.length} gradients` : 'no Float32Array'}, the shard holds ${this.shard.numel} elements`,
      );
    }
    if (!allFinite(grads)) throw refuse('nonfinite', 'the gradients hold a NaN or an infinity');
    this.pushes[worker]++;
    this.arrived[worker] = true;
    this.count++;
    if (worker === this.next) {
      this.fold(grads);
      while (this.next < this.numWorkers && this.pending[this.next]) {
        this.fold(this.pending[this.next]!);
        this.pending[this.next - 1] = null;
      }
    } else {
      // Copied: the caller (a transport) may reuse its buffer.
      this.pending[worker] = grads.slice();
    }
    if (this.count < this.numWorkers) return { status: 'waiting', step: expected, arrived: this.count, missing: this.missing() };
    const average = this.sum!;
    for (let i = 0; i < average.length; i++) average[i] /= this.numWorkers;
    this.resetStep();
    const version = this.shard.applyGradients(average);
    this.stepsApplied++;
    return { status: 'applied', step: expected, version, average, checkpointDue: this.shard.checkpointDue() };
  }

  /**
   * Drops what has arrived for the current step (a worker was lost and will not push it): the
   * workers push the step again, or a new accumulator with fewer workers takes over.
   */
  abandonStep(): void {
    this.resetStep();
  }

  stats(): { step: number; stepsApplied: number; pushesByWorker: number[] } {
    return { step: this.step, stepsApplied: this.stepsApplied, pushesByWorker: [...this.pushes] };
  }

  /** Adds worker `next`'s gradients to the running sum (float32, in worker order). */
  private fold(grads: Float32Array): void {
    if (this.next === 0) this.sum = grads.slice();
    else {
      const sum = this.sum!;
      for (let i = 0; i < sum.length; i++) sum[i] += grads[i];
    }
    this.next++;
  }

  private resetStep(): void {
    this.sum = null;
    this.pending.fill(null);
    this.arrived.fill(false);
    this.count = 0;
    this.next = 0;
  }
}
