/**
 * Server 0's book of the run's samples (tf.data service's dynamic sharding): it hands each
 * worker the next batch of the epoch's shuffled order as a lease, and accounts for every sample
 * handed out: applied, dropped as stale, refused, or lost with a worker that left holding it.
 * Pure (no transport, no tensors): the runner asks it at each request, and it is tested alone.
 *
 * - Asynchronous: a lease is the next `batchSize` samples of the epoch, whatever the worker's
 *   speed ("virtual epochs": an epoch is the dataset once, by all workers together). A worker
 *   holds at most one lease; one still out when it asks again never reached it (the reply was
 *   lost with a round) and is handed out again.
 * - CentralStorage: worker i of W gets the DistributedSampler shard i of the step's W x batchSize
 *   samples, as DDP takes them; the step's samples count once the step is applied, and a step
 *   abandoned by a new round is handed out again.
 */
import type { ScheduleOptions } from '../../elastic/agent.ts';
import { batchOf, planEpoch } from '../../elastic/epoch.ts';

/** Samples of the run as server 0 counts them. */
export interface PsSampleCounts {
  /** epochs x the dataset (or steps x batch size with a step limit). */
  target: number;
  leased: number;
  applied: number;
  stale: number;
  refused: number;
  lost: number;
  /** Whole epochs handed out. */
  epoch: number;
}

/** A batch server 0 handed a worker: DistributedSampler rank `rank` of `replicas` at (epoch, position), `count` samples. */
export interface Lease {
  epoch: number;
  position: number;
  replicas: number;
  rank: number;
  count: number;
}

/** The run's schedule (virtual epochs, ignored with `steps`: pushes (async) or steps (central)). */
export interface LeaseOptions extends Omit<ScheduleOptions, 'dropLast'> {
  strategy: 'async' | 'central';
  /** CentralStorage with `steps`: the workers of a step, for the target's count. */
  workersPerStep?: number;
}

/** What happened to a push, as the book counts it. */
export type PushOutcome = 'applied' | 'stale' | 'duplicate' | 'refused';

/** Counts and cursor as server 0 checkpoints them (`ps-0`'s metadata) and the store records them. */
export type LeaseSnapshot = PsSampleCounts & { position: number };

export class LeaseBook {
  private counts: PsSampleCounts;
  private cursor = { epoch: 0, position: 0 };
  /** The lease each worker holds (handed out, not pushed yet), and its samples. */
  private readonly inFlight = new Map<number, { lease: Lease; samples: number }>();

  constructor(private readonly o: LeaseOptions) {
    const epochs = o.steps == null ? (o.epochs ?? 1) : Number.POSITIVE_INFINITY;
    const target =
      o.steps != null
        ? o.steps * o.batchSize * (o.strategy === 'central' ? Math.max(1, o.workersPerStep ?? 1) : 1)
        : epochs * o.datasetLength;
    this.counts = { target, leased: 0, applied: 0, stale: 0, refused: 0, lost: 0, epoch: 0 };
  }

  /** A copy of the counts. */
  get samples(): PsSampleCounts {
    return { ...this.counts };
  }

  snapshot(): LeaseSnapshot {
    return { ...this.counts, position: this.cursor.position };
  }

  /**
   * Whether the run's samples (or steps: `version`, the shard's) are all handed out; with
   * `workerId`, whether there is nothing left for that worker: a lease it holds unanswered (its
   * reply was lost with a round) is still its to train.
   */
  exhausted(version: number, workerId?: number): boolean {
    const o = this.o;
    if (o.strategy === 'central') {
      const epochs = o.steps == null ? (o.epochs ?? 1) : Number.POSITIVE_INFINITY;
      return this.cursor.epoch >= epochs || (o.steps != null && version >= o.steps);
    }
    return this.counts.leased >= this.counts.target && (workerId === undefined || !this.inFlight.has(workerId));
  }

  /** The next batch for worker `workerId` (index `workerIndex` of `numWorkers` in the round); null once the samples are all handed out. */
  lease(workerId: number, workerIndex: number, numWorkers: number, version: number): Lease | null {
    const o = this.o;
    const length = o.datasetLength;
    if (o.strategy === 'central') {
      if (this.exhausted(version)) return null;
      const lease = {
        epoch: this.cursor.epoch,
        position: this.cursor.position,
        replicas: numWorkers,
        rank: workerIndex,
        count: o.batchSize,
      };
      const samples = batchOf(
        planEpoch(
          length,
          { ...this.cursor, step: 0 },
          { numReplicas: numWorkers, rank: workerIndex, batchSize: o.batchSize, shuffle: o.shuffle, seed: o.seed },
        ),
        0,
        o.batchSize,
      ).indices.length;
      this.inFlight.set(workerId, { lease, samples });
      return lease;
    }
    // Requests and replies alternate, and a push returns its lease first: a lease still out
    // when its worker asks for the next batch never reached it. Hand it out again.
    const unanswered = this.inFlight.get(workerId);
    if (unanswered !== undefined) return unanswered.lease;
    const left = this.counts.target - this.counts.leased;
    if (left <= 0) return null;
    const count = Math.min(o.batchSize, length - this.cursor.position, left);
    const lease = { epoch: this.cursor.epoch, position: this.cursor.position, replicas: 1, rank: 0, count };
    this.cursor.position += count;
    if (this.cursor.position >= length) this.cursor = { epoch: this.cursor.epoch + 1, position: 0 };
    this.counts.leased += count;
    this.counts.epoch = this.cursor.epoch;
    this.inFlight.set(workerId, { lease, samples: count });
    return lease;
  }

  /** CentralStorage: a step was applied; its W x batchSize samples are done. */
  stepApplied(numWorkers: number): void {
    const o = this.o;
    const length = o.datasetLength;
    const plan = planEpoch(
      length,
      { ...this.cursor, step: 0 },
      { numReplicas: numWorkers, rank: 0, batchSize: o.batchSize, shuffle: o.shuffle, seed: o.seed },
    );
    const position = plan.stepsLeft <= 1 ? length : Math.min(length, this.cursor.position + o.batchSize * numWorkers);
    this.cursor = position >= length ? { epoch: this.cursor.epoch + 1, position: 0 } : { epoch: this.cursor.epoch, position };
    this.counts.epoch = this.cursor.epoch;
    for (const { samples } of this.inFlight.values()) {
      this.counts.leased += samples;
      this.counts.applied += samples;
    }
    this.inFlight.clear();
  }

  /**
   * Asynchronous: where a push's samples went. `samplesHint` (the worker's own count, at most a
   * batch) stands in when the book has no lease for it (server 0 was restored from a checkpoint).
   */
  pushed(workerId: number, outcome: PushOutcome, samplesHint: number): void {
    if (outcome === 'duplicate') return; // counted when it was first handled
    const samples = this.inFlight.get(workerId)?.samples ?? Math.min(samplesHint, this.o.batchSize);
    this.inFlight.delete(workerId);
    this.counts[outcome] += samples;
  }

  /**
   * A new round: workers not in `present` took their leases with them. Asynchronous, their
   * samples are lost (returned, by worker); CentralStorage hands the step out again.
   */
  roundChanged(present: ReadonlySet<number>): Array<{ workerId: number; samples: number }> {
    const lost: Array<{ workerId: number; samples: number }> = [];
    if (this.o.strategy === 'central') {
      this.inFlight.clear();
      return lost;
    }
    for (const [workerId, { samples }] of this.inFlight) {
      if (present.has(workerId)) continue;
      this.inFlight.delete(workerId);
      this.counts.lost += samples;
      lost.push({ workerId, samples });
    }
    return lost;
  }

  /** Takes a snapshot back (from `ps-0`'s checkpoint metadata: untrusted, so every field is checked). */
  load(l: Partial<LeaseSnapshot>): void {
    const n = (x: unknown) => (typeof x === 'number' && Number.isSafeInteger(x) && x >= 0 ? x : 0);
    this.counts = {
      ...this.counts,
      leased: n(l.leased),
      applied: n(l.applied),
      stale: n(l.stale),
      refused: n(l.refused),
      lost: n(l.lost),
      epoch: n(l.epoch),
    };
    this.cursor = { epoch: n(l.epoch), position: Math.min(n(l.position), this.o.datasetLength) };
  }
}

/** The samples of a lease, as a worker reads them: DistributedSampler rank `rank` of `replicas` from (epoch, position). */
export function leaseIndices(l: Lease, o: Omit<ScheduleOptions, 'dropLast'>): number[] {
  const length = o.datasetLength;
  if (!(l.replicas >= 1 && l.rank < l.replicas && l.position <= length && l.count >= 1 && l.count <= Math.max(o.batchSize, 1))) {
    throw new RangeError(
      `parameter server 0 handed out a lease this worker cannot read: ${JSON.stringify(l)} (dataset of ${length}, batch ${o.batchSize})`,
    );
  }
  const plan = planEpoch(
    length,
    { epoch: l.epoch, position: l.position, step: 0 },
    { numReplicas: l.replicas, rank: l.rank, batchSize: l.count, shuffle: o.shuffle, seed: o.seed },
  );
  return batchOf(plan, 0, l.count).indices;
}
