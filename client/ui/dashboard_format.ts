/**
 * Small helpers the dashboard's modules share: plurals, means, and the epoch as people count it.
 */
import type { DashboardState } from './dashboard_types.ts';
import { fmtInt } from './format.ts';

/** The mean of the finite values, NaN when there are none. */
export function mean(xs: readonly number[]): number {
  const ok = xs.filter(Number.isFinite);
  return ok.length ? ok.reduce((a, b) => a + b, 0) / ok.length : NaN;
}

/** "1 tab", "3 tabs"; `many` for nouns that do not just take an s ("micro-batches"). */
export function plural(n: number, noun: string, many = `${noun}s`): string {
  return `${n} ${n === 1 ? noun : many}`;
}

/** plural() with the count as the page writes figures ("101,770 parameters"). */
export function pluralInt(n: number, noun: string, many = `${noun}s`): string {
  return `${fmtInt(n)} ${n === 1 ? noun : many}`;
}

/** 1-based epoch for people, whatever the job counts from. */
export function epochLabel(s: DashboardState, epoch: number): string {
  return String(epoch + (s.epochBase === 0 ? 1 : 0));
}

/** "2 of 3" when the job trains whole epochs, else "2". */
export function epochOf(s: DashboardState, epoch: number): string {
  const total = s.config && s.config.steps === null ? ` of ${s.config.epochs}` : '';
  return `${epochLabel(s, epoch)}${total}`;
}
