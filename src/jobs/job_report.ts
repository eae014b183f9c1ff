/**
 * What a page reports to the launcher (or a Playwright test) as it runs: the page calls
 * `window.__ddpReport(report)`, which the launcher exposes before the page loads. Both ends
 * import these types from here; the launcher imports nothing from `client/`. A report arrives
 * from a page, which may be anything: the launcher reads it with parseReport.
 */
import type { ElasticEvent } from '../parallel/events.ts';

/**
 * A rank's result at its job's end: the train job's summary (every strategy's trainer fills the
 * typed fields), a built-in job's figures, or a script's returned object. The launcher's
 * summaries read the other fields one by one, each checked (launcher/summary_*.ts).
 */
export interface JobResult {
  /** The rank that reports it (else the launcher's own count of the page). */
  rank?: number;
  worldSize?: number;
  /** A hash of the rank's final weights (hashFloat32's 8 hex digits; a script's own token): the replicas' identity in the summary. */
  weightHash?: string;
  /** --dump-weights: rank 0's final weights, float32 little-endian, base64. */
  weights?: string;
  steps?: number;
  [field: string]: unknown;
}

/** The train job's summary as each trainer writes it: the fields every strategy fills. */
export interface TrainJobResult extends JobResult {
  rank: number;
  worldSize: number;
  backend: string;
  model: string;
  dataset: string;
  steps: number;
  epochs: number;
  weightHash: string;
  seconds: number;
  generations: number;
}

export type Report =
  | { type: 'rank'; rank: number; worldSize: number }
  /** The library's own events (rounds, the samples each step trained, the end), from the built-in job and from user scripts alike. */
  | { type: 'elastic'; event: ElasticEvent }
  | { type: 'result'; result: JobResult }
  | { type: 'error'; name: string; message: string };

/** One link as a rank reports it to the launcher: which way its bytes go (see ProcessGroup.linkDetails). */
export interface LinkReport {
  peer: number;
  state: string;
  local: string | null;
  remote: string | null;
  protocol: string | null;
  rttMs: number | null;
}

/** A report that is not one: what is wrong with it, in words. */
export class ReportError extends Error {
  override name = 'ReportError';
}

/** The longest error name and message kept from a page (the rest is cut, marked). */
const MAX_ERROR_TEXT = 4000;

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;
const cut = (text: string): string => (text.length > MAX_ERROR_TEXT ? `${text.slice(0, MAX_ERROR_TEXT)}... (cut)` : text);

/**
 * A page's report, checked at the boundary: its `type` one of the four, a rank's numbers whole,
 * an event an object with a `type`, a result an object whose typed fields have their types, an
 * error's name and message strings (cut to MAX_ERROR_TEXT). Throws ReportError naming the field.
 */
export function parseReport(raw: unknown): Report {
  if (!isObject(raw) || typeof raw.type !== 'string') throw new ReportError('a report must be an object with a string type');
  switch (raw.type) {
    case 'rank':
      if (!isCount(raw.rank) || !isCount(raw.worldSize) || raw.worldSize < 1 || raw.rank >= raw.worldSize)
        throw new ReportError(
          `a 'rank' report needs a rank from 0 to worldSize - 1 (whole numbers), got ${String(raw.rank)} of ${String(raw.worldSize)}`,
        );
      return { type: 'rank', rank: raw.rank, worldSize: raw.worldSize };
    case 'elastic':
      if (!isObject(raw.event) || typeof raw.event.type !== 'string')
        throw new ReportError("an 'elastic' report needs an event with a string type");
      for (const k of ['step', 'totalSteps', 'rank', 'worldSize'] as const) {
        if (raw.event[k] !== undefined && !isCount(raw.event[k]))
          throw new ReportError(`the '${raw.event.type}' event's ${k} must be a whole number >= 0, got ${String(raw.event[k])}`);
      }
      return { type: 'elastic', event: raw.event as unknown as ElasticEvent };
    case 'result':
      return { type: 'result', result: parseJobResult(raw.result) };
    case 'error':
      if (typeof raw.name !== 'string' || typeof raw.message !== 'string')
        throw new ReportError("an 'error' report needs a string name and message");
      return { type: 'error', name: cut(raw.name), message: cut(raw.message) };
    default:
      throw new ReportError(`a report's type must be rank, elastic, result or error, got "${cut(raw.type)}"`);
  }
}

/** A result's typed fields checked (whole numbers, a short hash, base64); the rest kept as sent. */
function parseJobResult(raw: unknown): JobResult {
  if (!isObject(raw)) throw new ReportError("a 'result' report needs its result as an object");
  for (const k of ['rank', 'worldSize', 'steps'] as const) {
    if (raw[k] !== undefined && !isCount(raw[k]))
      throw new ReportError(`a result's ${k} must be a whole number >= 0, got ${String(raw[k])}`);
  }
  if (raw.weightHash !== undefined && !(typeof raw.weightHash === 'string' && /^[0-9A-Za-z._:-]{1,128}$/.test(raw.weightHash)))
    throw new ReportError("a result's weightHash must be a short token (1-128 of A-Z a-z 0-9 . _ : -), as hashFloat32's 8 hex digits are");
  if (raw.weights !== undefined && !(typeof raw.weights === 'string' && /^[A-Za-z0-9+/]*={0,2}$/.test(raw.weights)))
    throw new ReportError("a result's weights must be base64 text");
  return raw as JobResult;
}
