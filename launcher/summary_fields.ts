/** A rank's result as the launcher reads it, and the checks and roundings the summaries read its fields with (a page's result is its own to fill). */

export type RankResult = Record<string, unknown> & { rank: number };

export const round = (x: number) => Math.round(x * 100) / 100;

export const finite = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
export const count = (v: unknown): number | null => (Number.isSafeInteger(v) && (v as number) >= 0 ? (v as number) : null);
export const round4 = (x: number) => Math.round(x * 10_000) / 10_000;

export const record = (v: unknown): Record<string, unknown> | null =>
  typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
export const rounded = (v: unknown): number | null => (finite(v) === null ? null : round(v as number));
