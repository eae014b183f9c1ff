/**
 * The end-of-run report's model: what the run was and how it went, its summary's figures for
 * "Details", and the report in one line for the log.
 */
import type { DashboardState } from './dashboard_types.ts';
import { epochLabel, plural } from './dashboard_format.ts';
import { runSeconds } from './dashboard_progress.ts';
import { fmtDuration, fmtInt, fmtMs, fmtNumber, fmtPercent } from './format.ts';

export function finalTestAccuracy(s: DashboardState): number | null {
  const fromSummary = s.summary?.testAccuracy;
  if (typeof fromSummary === 'number' && Number.isFinite(fromSummary)) return fromSummary;
  return s.lastEval?.testAccuracy ?? null;
}

export interface SummaryEntry {
  /** The summary's key (shared by the entries of one flattened object). */
  key: string;
  label: string;
  value: string;
}

/** Shown already in the header, or not for people (the weights themselves). */
const SUMMARY_SKIP = new Set(['rank', 'worldSize', 'backend', 'model', 'dataset', 'weights']);
const SUMMARY_FIRST = [
  'testAccuracy',
  'testLoss',
  'finalLoss',
  'steps',
  'epochs',
  'seconds',
  'elapsedSec',
  'samplesPerSec',
  'stoppedBy',
  'generations',
  'pausedGenerations',
  'weightHash',
];

/**
 * The summary's scalar entries, most interesting first. One level of nested numbers (the
 * job's breakdownMs) is flattened; arrays and long strings are left out.
 */
export function summaryEntries(summary: Readonly<Record<string, unknown>>): SummaryEntry[] {
  const out: SummaryEntry[] = [];
  const scalar = (v: unknown) => v === null || typeof v === 'number' || typeof v === 'boolean' || (typeof v === 'string' && v.length <= 80);
  for (const [k, v] of Object.entries(summary)) {
    if (SUMMARY_SKIP.has(k)) continue;
    if (scalar(v)) out.push({ key: k, label: humanKey(k), value: fmtSummaryValue(k, v) });
    else if (v && typeof v === 'object' && !Array.isArray(v)) {
      const inner = Object.entries(v as Record<string, unknown>);
      if (inner.length > 0 && inner.length <= 8 && inner.every(([, x]) => x === null || typeof x === 'number')) {
        const unitKey = /Ms$/.test(k) ? 'Ms' : '';
        for (const [sub, x] of inner) out.push({ key: k, label: `${humanKey(k)}: ${sub}`, value: fmtSummaryValue(`${sub}${unitKey}`, x) });
      }
    }
  }
  const order = (key: string) => {
    const i = SUMMARY_FIRST.indexOf(key);
    return i < 0 ? SUMMARY_FIRST.length : i;
  };
  return out.sort((a, b) => order(a.key) - order(b.key));
}

export interface ReportItem {
  key: 'trained' | 'training' | 'time' | 'accuracy' | 'speed' | 'faults';
  label: string;
  value: string;
}

/** The end-of-run panel: a few facts for everyone, and the developers' figures behind "Details". */
export interface RunReport {
  main: ReportItem[];
  details: SummaryEntry[];
}

const MODEL_NAME: Readonly<Record<string, string>> = { mlp: 'MLP', cnn: 'CNN' };
const DATASET_NAME: Readonly<Record<string, string>> = { mnist: 'MNIST', synthetic: 'synthetic data' };
/** In the main part of the report, or said by the page elsewhere (rank, backend): not repeated in Details. */
const REPORTED = new Set(['testAccuracy', 'samplesPerSec', 'stepsRedone', 'steps', 'seconds', 'epochs']);

/** What the run was and how it went, once 'done' arrived (null before). */
export function runReport(s: DashboardState): RunReport | null {
  const summary = s.summary;
  if (!summary) return null;
  const c = s.config;
  const main: ReportItem[] = [];
  const model = typeof summary.model === 'string' ? summary.model : c?.model;
  const dataset = typeof summary.dataset === 'string' ? summary.dataset : c?.dataset;
  const samples = s.shard?.datasetSize ?? (c && c.trainSize > 0 ? c.trainSize : null);
  if (model && dataset) {
    const data = samples !== null ? `, ${fmtInt(samples)} training samples` : '';
    main.push({ key: 'trained', label: 'Trained', value: `${MODEL_NAME[model] ?? model} on ${DATASET_NAME[dataset] ?? dataset}${data}` });
  }
  const steps = typeof summary.steps === 'number' ? summary.steps : s.lastStep?.step;
  if (steps !== undefined) {
    // Epochs as people count them: the first is epoch 1, also while the run is still inside it.
    const epoch = s.lastStep ? Number(epochLabel(s, s.lastStep.epoch)) : null;
    const allEpochs =
      c !== null && c.steps === null && epoch === c.epochs && s.lastStep !== null && s.lastStep.step >= s.lastStep.totalSteps;
    const epochs =
      epoch === null
        ? ''
        : allEpochs
          ? ` · ${plural(epoch, 'epoch')}`
          : c && c.steps === null
            ? ` · epoch ${epoch} of ${c.epochs}`
            : ` · in epoch ${epoch}`;
    const tabs = s.worldSize !== null ? ` · ${plural(s.worldSize, 'tab')} at the end` : '';
    main.push({ key: 'training', label: 'Training', value: `${fmtInt(steps)} steps${epochs}${tabs}` });
  }
  const seconds = runSeconds(s);
  if (seconds !== null) main.push({ key: 'time', label: 'Total time', value: fmtDuration(seconds) });
  const accuracy = finalTestAccuracy(s);
  if (accuracy !== null) main.push({ key: 'accuracy', label: 'Final test accuracy', value: fmtPercent(accuracy, 2) });
  if (typeof summary.samplesPerSec === 'number')
    main.push({ key: 'speed', label: 'Speed', value: `${fmtInt(summary.samplesPerSec)} samples/s, all tabs together` });
  main.push({ key: 'faults', label: 'Faults survived', value: faultSummary(s) });
  return { main, details: summaryEntries(summary).filter((e) => !REPORTED.has(e.key)) };
}

/**
 * The group's faults in one line ("1 tab closed, 2 tabs joined mid-run, 1 step trained again",
 * or "none"): from the server's record and the run record's steps trained again, so the same on
 * every tab. The run's own figure, once it is done, is the run record's too.
 */
export function faultSummary(s: DashboardState): string {
  const c = s.faults.counts;
  const final = s.summary?.stepsRedone;
  const redone = typeof final === 'number' && Number.isSafeInteger(final) && final >= 0 ? final : s.faults.stepsRedone;
  const parts = [
    c.left ? `${plural(c.left, 'tab')} closed` : '',
    c.froze ? `${plural(c.froze, 'tab')} froze or went silent` : '',
    c.removed ? `${plural(c.removed, 'tab')} removed by the host` : '',
    c.failed ? `${plural(c.failed, 'tab')} lost ${c.failed === 1 ? 'its' : 'their'} connection` : '',
    c.joined ? `${plural(c.joined, 'tab')} joined mid-run` : '',
    redone ? `${plural(redone, 'step')} trained again` : '',
  ].filter(Boolean);
  return parts.length ? parts.join(', ') : 'none';
}

/**
 * The group's fault history, one line per fault, oldest first ("Round 4: lost rank 2 (its tab
 * closed)"; "Round 5: a tab joined as rank 3"), the server's latest entries, after a line saying
 * how many earlier ones it no longer lists. Empty when there were none.
 */
export function faultHistoryLines(s: DashboardState): string[] {
  const { counts, entries } = s.faults;
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const earlier = total - entries.length;
  const lines = entries.map((e) =>
    e.kind === 'joined' ? `Round ${e.round}: a tab joined as rank ${e.rank}` : `Round ${e.round}: lost rank ${e.rank} (${e.reason})`,
  );
  return earlier > 0 ? [`${plural(earlier, 'earlier fault')} not listed`, ...lines] : lines;
}

/** The report in one line, for the log. */
export function summaryLine(s: DashboardState): string {
  return (runReport(s)?.main ?? [])
    .filter((e) => e.key !== 'trained')
    .map((e) => `${e.label}: ${e.value}`)
    .join(', ');
}

/** "testAccuracy" -> "Test accuracy"; duration keys lose their unit ("elapsedSec" -> "Elapsed"). */
function humanKey(k: string): string {
  const base = isDurationKey(k) ? k.replace(/_?(sec|seconds)$/i, '') : k.replace(/Ms$/, '');
  if (base === '') return 'Time';
  const words = base
    .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
    .replace(/[_-]+/g, ' ')
    .toLowerCase();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** Keys like elapsedSec / seconds are durations; samplesPerSec is not. */
function isDurationKey(k: string): boolean {
  return !/per ?sec/i.test(k) && /(sec|seconds)$/i.test(k);
}

function fmtSummaryValue(k: string, v: unknown): string {
  if (v === null || v === undefined) return '–';
  if (k === 'stoppedBy' && typeof v === 'number') return `rank ${v}`;
  if (typeof v === 'number') {
    if (/acc/i.test(k) && v >= 0 && v <= 1) return fmtPercent(v, 2);
    if (isDurationKey(k)) return fmtDuration(v);
    if (/Ms$/.test(k)) return fmtMs(v);
    if (/per ?sec/i.test(k)) return fmtInt(v);
    return fmtNumber(v, 4);
  }
  return String(v);
}
