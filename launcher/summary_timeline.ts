/**
 * A DDP run's step timeline across ranks: each phase's mean over the ranks of their mean ms per
 * step (see client/train/ddp_trainer.ts's stepTimeline), and the step's communication (the
 * exposed all-reduce, waiting for the slowest rank plus the wire, and the vote) against the same
 * reductions timed bare in the same run.
 */
import { finite, record, round, type RankResult } from './summary_fields.ts';

export interface TimelineSummary {
  timelineMs?: Record<string, number | null>;
  /** The buckets' float32 all-reduce alone, after training (the slowest rank's median). */
  bareAllReduceMs?: number | null;
  /** (waitSlowest + wire + vote) / bareAllReduceMs: the "communication phase against the bare collective". */
  commOverBare?: number | null;
  /** wire / bareAllReduceMs: the all-reduce with the wait for the slowest rank taken out. */
  wireOverBare?: number | null;
}

export function timelineSummary(ranks: RankResult[]): TimelineSummary {
  const timelines = ranks.map((r) => record(r.timelineMs)).filter((t): t is Record<string, unknown> => t !== null);
  if (timelines.length === 0) return {};
  const keys = Object.keys(timelines[0]!);
  const timelineMs = Object.fromEntries(
    keys.map((k) => {
      const vs = timelines.map((t) => finite(t[k])).filter((v): v is number => v !== null);
      return [k, vs.length > 0 ? round(vs.reduce((s, v) => s + v, 0) / vs.length) : null];
    }),
  );
  const bares = ranks.map((r) => finite(r.bareAllReduceMs)).filter((v): v is number => v !== null);
  const bare = bares.length > 0 ? Math.max(...bares) : null;
  const comm = ['waitSlowest', 'wire', 'vote'].map((k) => timelineMs[k]);
  const ratio = (v: number | null) => (bare !== null && bare > 0 && v !== null ? round(v / bare) : null);
  return {
    timelineMs,
    bareAllReduceMs: bare === null ? null : round(bare),
    commOverBare: ratio(comm.every((v) => v !== null && v !== undefined) ? (comm as number[]).reduce((s, v) => s + v, 0) : null),
    wireOverBare: ratio(timelineMs.wire ?? null),
  };
}
