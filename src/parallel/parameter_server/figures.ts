/**
 * The parameter-server run's figures (for runner.ts): a server's update and push rates over the
 * last few seconds, and a worker's counts of its pulls, pushes and server 0's verdicts, as the
 * status reports and the run's result give them. Kept apart from the run's logic, which only
 * notes events here.
 */
import type { ParameterServerShard } from './shard.ts';
import type { ParameterServerRunResult, PsStatus } from './types.ts';
import { VERDICT } from './wire.ts';

/** How far back the rates look, in ms. */
const RATE_WINDOW_MS = 5000;

/** A server's update and push rates. */
export class ServerFigures {
  /** [time, version] of the updates of the last RATE_WINDOW_MS. */
  private readonly updates: Array<[number, number]> = [];
  /** [time, pushes] of each worker's status reports of the last RATE_WINDOW_MS, by worker id. */
  private readonly pushSnapshots = new Map<number, Array<[number, number]>>();
  private firstUpdateAt: number | null = null;

  /** The shard applied an update and is now at `version`. */
  noteUpdate(version: number): void {
    const now = performance.now();
    this.firstUpdateAt ??= now;
    this.updates.push([now, version]);
    while (this.updates.length > 0 && now - this.updates[0]![0] > RATE_WINDOW_MS) this.updates.shift();
  }

  /** Updates per second since the first (those restored from a checkpoint not counted); null before two. */
  overallUpdatesPerSec(version: number, restoredFrom: number | null): number | null {
    const last = this.updates.at(-1);
    if (this.firstUpdateAt === null || !last || last[0] <= this.firstUpdateAt) return null;
    return (version - (restoredFrom ?? 0)) / ((last[0] - this.firstUpdateAt) / 1000);
  }

  /** The server's part of a status report; notes each worker's pushes for its rate. */
  status(shard: ParameterServerShard, workers: ReadonlyArray<{ workerId: number; rank: number }>): NonNullable<PsStatus['server']> {
    const now = performance.now();
    const stats = shard.stats();
    const first = this.updates[0];
    const last = this.updates.at(-1);
    const updatesPerSec = first && last && last[0] > first[0] ? (last[1] - first[1]) / ((last[0] - first[0]) / 1000) : 0;
    const rankOf = new Map(workers.map((w) => [w.workerId, w.rank]));
    const pushRates = stats.workers.map((w) => {
      const snaps = this.pushSnapshots.get(w.worker) ?? [];
      snaps.push([now, w.pushes]);
      while (snaps.length > 1 && now - snaps[0]![0] > RATE_WINDOW_MS) snaps.shift();
      this.pushSnapshots.set(w.worker, snaps);
      const [t0, p0] = snaps[0]!;
      return {
        workerId: w.worker,
        rank: rankOf.get(w.worker) ?? null,
        pushesPerSec: now > t0 ? ((w.pushes - p0) / (now - t0)) * 1000 : 0,
        pushes: w.pushes,
        applied: w.applied,
      };
    });
    return {
      index: shard.index,
      version: stats.version,
      updatesPerSec,
      applied: stats.applied,
      stale: stats.stale,
      duplicate: stats.duplicate,
      refused: stats.refused,
      stalenessHistogram: stats.stalenessHistogram,
      pushRates,
    };
  }
}

/** A worker's counts: its pulls and pushes, and what server 0 said of its pushes. */
export class WorkerFigures {
  pulls = 0;
  pushes = 0;
  applied = 0;
  stale = 0;
  refused = 0;
  samples = 0;
  lastStaleness: number | null = null;
  /** Pushes applied or dropped as stale, by staleness (the last bucket: that staleness and above). */
  readonly histogram = new Array<number>(32).fill(0);

  /** Server 0's verdict on this worker's last push. */
  noteVerdict(verdict: number, staleness: number): void {
    if (verdict === VERDICT.applied) this.applied++;
    else if (verdict === VERDICT.stale) this.stale++;
    else if (verdict === VERDICT.refused) this.refused++;
    if (verdict === VERDICT.applied || verdict === VERDICT.stale) {
      this.lastStaleness = staleness;
      this.histogram[Math.min(staleness, this.histogram.length - 1)]!++;
    }
  }

  /** The worker's part of a status report. */
  status(workerId: number): NonNullable<PsStatus['worker']> {
    return {
      workerId,
      pulls: this.pulls,
      pushes: this.pushes,
      applied: this.applied,
      stale: this.stale,
      samples: this.samples,
      lastStaleness: this.lastStaleness,
    };
  }

  /** The worker's part of the run's result. */
  result(workerId: number): NonNullable<ParameterServerRunResult['worker']> {
    return {
      workerId,
      pulls: this.pulls,
      pushes: this.pushes,
      applied: this.applied,
      stale: this.stale,
      refused: this.refused,
      samples: this.samples,
      stalenessHistogram: [...this.histogram],
    };
  }
}
