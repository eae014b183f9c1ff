/**
 * The stat cards' model: the five figures above the charts (loss, accuracy, test accuracy, speed, time).
 */
import { RECENT, type DashboardState } from './dashboard_state.ts';
import { plural } from './dashboard_format.ts';
import { sampleWeighted } from './sample_weighted.ts';
import { rankAverages } from './dashboard_perf.ts';
import { runSeconds } from './dashboard_progress.ts';
import { timeLeft } from './time_left.ts';
import { fmtDuration, fmtInt, fmtNumber, fmtPercent } from './format.ts';

export type StatKey = 'loss' | 'acc' | 'test' | 'speed' | 'time';

export interface StatCard {
  value: string;
  /** Shown smaller after the value. */
  unit?: string;
  sub: string;
}

/** The five figures above the charts. */
export function statCards(s: DashboardState): Record<StatKey, StatCard> {
  const empty: StatCard = { value: '–', sub: '' };
  const cards: Record<StatKey, StatCard> = { loss: empty, acc: empty, test: empty, speed: empty, time: empty };
  const all = [...s.recent.values()].flat();
  const e = s.lastStep;
  if (e) {
    // Weighted by the samples each rank trained: a rank given none has no loss to count.
    const loss = sampleWeighted(all, 'loss') ?? NaN;
    const span = Math.min(RECENT, s.stepClock.length);
    cards.loss = { value: fmtNumber(loss, loss < 1 ? 4 : 3), sub: span === 1 ? 'all ranks, last step' : `all ranks, last ${span} steps` };
    cards.acc = {
      value: fmtPercent(sampleWeighted(all, 'accuracy') ?? NaN),
      sub: s.config?.model === 'lm' ? 'next character, training batches' : 'training batches, same window',
    };
    const ranks = rankAverages(s);
    const p = s.pipeline;
    // Every sample of a pipeline run passes through each stage: a replica counts once, at its first stage.
    const counted = p && s.pipelineRanks.size > 0 ? ranks.filter((r) => s.pipelineRanks.get(r.rank)?.stage === 0) : ranks;
    const total = counted.reduce((sum, r) => sum + (Number.isFinite(r.samplesPerSec) ? r.samplesPerSec : 0), 0);
    const replicas = p ? p.replicas : e.ranks.length;
    const who = p ? `${plural(p.replicas, 'replica')} of ${plural(p.stages, 'stage')}` : plural(ranks.length, 'rank');
    // A language model's sample is a window of characters: its speed reads as characters per second.
    const windowChars = s.config?.model === 'lm' ? (s.config.context ?? null) : null;
    cards.speed =
      windowChars !== null
        ? {
            value: fmtInt(total * windowChars),
            unit: ' characters/s',
            sub: `${who} · global batch ${s.config ? fmtInt(s.config.batchSize * replicas) : '?'} windows of ${windowChars}`,
          }
        : {
            value: fmtInt(total),
            unit: ' samples/s',
            sub: `${who} · global batch ${s.config ? fmtInt(s.config.batchSize * replicas) : '?'}`,
          };
    cards.time = timeCard(s);
  }
  const final = s.summary?.testAccuracy;
  const finalLoss = s.summary?.testLoss;
  const ev = s.lastEval;
  if (s.finished && typeof final === 'number') {
    // The job evaluates once more at the end (e.g. after a stop) without an 'eval' event.
    const loss =
      typeof finalLoss !== 'number'
        ? ''
        : s.config?.model === 'lm'
          ? `, perplexity ${fmtNumber(Math.exp(finalLoss), 2)}`
          : `, loss ${fmtNumber(finalLoss, 3)}`;
    cards.test = { value: fmtPercent(final), sub: `final${loss}` };
  } else if (ev) {
    const best = s.bestEval !== null && s.bestEval > ev.testAccuracy ? ` · best ${fmtPercent(s.bestEval)}` : '';
    // A language model's loss reads better as its perplexity (the characters it hesitates between).
    const loss = s.config?.model === 'lm' ? `perplexity ${fmtNumber(Math.exp(ev.testLoss), 2)}` : `loss ${fmtNumber(ev.testLoss, 3)}`;
    cards.test = { value: fmtPercent(ev.testAccuracy), sub: `at step ${fmtInt(ev.step)}, ${loss}${best}` };
  } else if (e) {
    cards.test = { value: '–', sub: 'no evaluation yet' };
  }
  return cards;
}

/** The TIME card: elapsed, and the time left the Progress panel shows too (time_left.ts). */
export function timeCard(s: DashboardState): StatCard {
  const e = s.lastStep;
  if (!e) return { value: '–', sub: '' };
  // The Progress panel's figure too: one estimate on the screen.
  const left = timeLeft(s);
  const sub =
    s.phase === 'done'
      ? 'total time'
      : s.phase === 'stopped'
        ? s.finished && runSeconds(s) !== e.elapsedSec
          ? `total time; stopped after ${fmtDuration(e.elapsedSec)}, then evaluated`
          : 'until stopped'
        : s.phase === 'failed'
          ? 'until it failed'
          : s.phase === 'ended'
            ? 'until the session ended'
            : s.phase === 'removed'
              ? 'until the host removed this tab'
              : left === null
                ? 'elapsed'
                : `elapsed · ${left.text}`;
  return { value: fmtDuration(runSeconds(s) ?? e.elapsedSec), sub };
}
