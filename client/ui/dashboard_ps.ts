/**
 * The Parameter server card's model: the layout, this tab's figures as a server or a worker, the
 * staleness histogram and the samples handed out, and the log's lines when its role or the layout changes.
 */
import type { DashboardState, PsStatus } from './dashboard_types.ts';
import { plural, pluralInt } from './dashboard_format.ts';
import { fmtInt, fmtPercent } from './format.ts';

/** What makes this tab's role: a change is said in the log. */
export function psRoleKey(p: PsStatus): string {
  return [p.strategy, p.role, p.rank, psSelfServer(p) ?? '', psSelfWorker(p) ?? ''].join('|');
}

/** Which rank serves which parameters and which ranks work: a change is said in the log. */
export function psLayoutKey(p: PsStatus): string {
  const servers = p.servers.map((s) => `${s.index}@${s.rank}:${s.parameters.join(',')}:${s.numel}`).join(';');
  const workers = p.workers.map((w) => `${w.workerId}@${w.rank}`).join(';');
  return `${servers}/${workers}`;
}

/** This tab's server index (its own figures, else the layout's server on its rank). */
function psSelfServer(p: PsStatus): number | null {
  if (p.role !== 'server') return null;
  return p.server?.index ?? p.servers.find((s) => s.rank === p.rank)?.index ?? null;
}

/** This tab's worker id (its own figures, else the layout's worker on its rank). */
function psSelfWorker(p: PsStatus): number | null {
  if (p.role !== 'worker') return null;
  return p.worker?.workerId ?? p.workers.find((w) => w.rank === p.rank)?.workerId ?? null;
}

/** "Parameter server 0 of 1 on this tab: 2 tensors, 101,770 parameters." / "Worker 3 (rank 2) of 3, pulling from 1 server." */
export function psRoleLine(p: PsStatus): string {
  if (p.role === 'server') {
    const index = psSelfServer(p);
    const info = p.servers.find((s) => s.index === index);
    const holds = info ? `: ${pluralInt(info.parameters.length, 'tensor')}, ${pluralInt(info.numel, 'parameter')}` : '';
    return `Parameter server ${index ?? '?'} of ${p.servers.length} on this tab${holds}.`;
  }
  const id = psSelfWorker(p);
  return `Worker ${id ?? '?'} (rank ${p.rank}) of ${p.workers.length}, pulling from ${plural(p.servers.length, 'server')}.`;
}

/** How many places a layout line names before it says "…". */
const PS_LINE_NAMES = 6;

/** "Parameter-server layout now: 1 server (server 0 on rank 0), 2 workers (worker 1 on rank 1, worker 3 on rank 2)." */
export function psLayoutLine(p: PsStatus): string {
  const names = (xs: string[]) => (xs.length > PS_LINE_NAMES ? `${xs.slice(0, PS_LINE_NAMES).join(', ')}, …` : xs.join(', '));
  const servers = names(p.servers.map((s) => `server ${s.index} on rank ${s.rank}`));
  const workers = names(p.workers.map((w) => `worker ${w.workerId} on rank ${w.rank}`));
  return `Parameter-server layout now: ${plural(p.servers.length, 'server')}${servers ? ` (${servers})` : ''}, ${plural(p.workers.length, 'worker')}${workers ? ` (${workers})` : ''}.`;
}

/** "0–3, 6, 8–9": indices as ascending runs. */
export function fmtIndices(indices: readonly number[]): string {
  const xs = [...new Set(indices)].filter(Number.isInteger).sort((a, b) => a - b);
  const runs: string[] = [];
  for (let i = 0; i < xs.length; ) {
    let j = i;
    while (j + 1 < xs.length && xs[j + 1] === xs[j]! + 1) j++;
    runs.push(j === i ? `${xs[i]}` : j === i + 1 ? `${xs[i]}, ${xs[j]}` : `${xs[i]}–${xs[j]}`);
    i = j + 1;
  }
  return runs.join(', ');
}

/** A rate per second: one decimal below 10, whole above. */
function fmtRate(x: number): string {
  if (!Number.isFinite(x)) return '–';
  return x >= 10 ? fmtInt(x) : x.toFixed(1);
}

/** One figure of a list of figures ("Applied: 1,204"). */
export interface PsFigure {
  key: string;
  label: string;
  value: string;
  /** Worth a look (samples lost or refused): drawn as a warning, with a sign, not only a colour. */
  warn?: boolean;
}

/** A row of the layout: a server and what it holds, or a worker. */
export interface PsLayoutRow {
  role: 'server' | 'worker';
  /** The server's index or the worker's id. */
  id: number;
  /** "server 0", "worker 3". */
  name: string;
  /** Its rank now. */
  rank: number;
  /** Servers: the number of parameter tensors and of elements it holds (null for workers). */
  tensors: number | null;
  numel: number | null;
  /** Servers: "tensors 0–3" (which of the model's trainable weights); "" for workers. */
  holds: string;
  /** This tab. */
  self: boolean;
}

export interface PsHistogramBar {
  /** The bucket: that staleness (the last bucket: that staleness and above). */
  staleness: number;
  /** "2", or "31+" for the last bucket. */
  label: string;
  /** The last bucket: that staleness and above. */
  tail: boolean;
  count: number;
  /** Height as a fraction of the tallest bar (0..1). */
  height: number;
  /** "staleness 2: 14 pushes" */
  ariaLabel: string;
}

export interface PsHistogram {
  bars: PsHistogramBar[];
  total: number;
  /** What the drawing shows, in one sentence (its accessible description). */
  caption: string;
}

export interface PsPushRateRow {
  workerId: number;
  /** Its rank now; null once it left. */
  rank: number | null;
  pushesPerSec: number;
  pushes: number;
  applied: number;
  /** "3.2", "12" */
  rateText: string;
}

export interface PsServerPanel {
  index: number;
  /** "tensors 0–1 (101,770 parameters)" */
  shardText: string;
  version: number;
  updatesPerSec: number;
  /** Version, updates/s, applied, stale, duplicate, refused. */
  figures: PsFigure[];
  histogram: PsHistogram;
  pushRates: PsPushRateRow[];
}

export interface PsWorkerPanel {
  workerId: number;
  /** Worker id, pulls, pushes, applied, stale, samples, last staleness. */
  figures: PsFigure[];
}

export interface PsSamplesPanel {
  target: number;
  leased: number;
  /** Leased as a fraction of the target (0..1). */
  fraction: number;
  /** "Leased 12,000 of 60,000 samples (20.0%) · virtual epoch 1 of 5" */
  leasedText: string;
  /** Applied, stale, refused, lost, virtual epoch. */
  figures: PsFigure[];
  /** Samples were lost or refused: the line is drawn as a warning. */
  warn: boolean;
}

/** What the Parameter server card shows (null when this is not a parameter-server run). */
export interface PsPanel {
  strategy: PsStatus['strategy'];
  role: PsStatus['role'];
  rank: number;
  /** "1 server · 3 workers · asynchronous: each worker pushes when it is ready · this tab: server 0 (rank 0)" */
  shape: string;
  layout: PsLayoutRow[];
  server: PsServerPanel | null;
  worker: PsWorkerPanel | null;
  samples: PsSamplesPanel | null;
}

const PS_STRATEGY: Readonly<Record<PsStatus['strategy'], string>> = {
  async: 'asynchronous: each worker pushes when it is ready',
  central: 'central, synchronous: the server averages every worker’s gradients once per step',
};

/** Staleness buckets drawn at least (when the histogram has that many), so a young run's bars keep their scale. */
const PS_MIN_BUCKETS = 8;

/** The histogram's bars: the buckets up to the last non-empty one (at least PS_MIN_BUCKETS), the last bucket "N+". */
export function psHistogram(histogram: readonly number[]): PsHistogram {
  const counts = histogram.map((c) => (Number.isFinite(c) && c > 0 ? c : 0));
  let lastFilled = -1;
  counts.forEach((c, i) => {
    if (c > 0) lastFilled = i;
  });
  const shown = Math.min(counts.length, Math.max(lastFilled + 1, PS_MIN_BUCKETS));
  const max = Math.max(0, ...counts);
  const total = counts.reduce((a, b) => a + b, 0);
  const bars = counts.slice(0, shown).map((count, staleness): PsHistogramBar => {
    const tail = staleness === counts.length - 1 && counts.length > 1;
    const label = tail ? `${staleness}+` : `${staleness}`;
    return {
      staleness,
      label,
      tail,
      count,
      height: max > 0 ? count / max : 0,
      ariaLabel: `staleness ${label}: ${pluralInt(count, 'push', 'pushes')}`,
    };
  });
  const caption =
    total === 0
      ? 'No pushes yet.'
      : `${pluralInt(total, 'push', 'pushes')} applied or dropped as stale, by staleness: how many versions the shard had moved on since the worker pulled.`;
  return { bars, total, caption };
}

export function psPanel(s: DashboardState): PsPanel | null {
  const p = s.ps;
  if (!p) return null;
  const serverIndex = psSelfServer(p);
  const workerId = psSelfWorker(p);
  const servers = [...p.servers].sort((a, b) => a.index - b.index);
  const workers = [...p.workers].sort((a, b) => a.workerId - b.workerId);
  const layout: PsLayoutRow[] = [
    ...servers.map(
      (sv): PsLayoutRow => ({
        role: 'server',
        id: sv.index,
        name: `server ${sv.index}`,
        rank: sv.rank,
        tensors: sv.parameters.length,
        numel: sv.numel,
        holds: sv.parameters.length ? `tensors ${fmtIndices(sv.parameters)}` : '–',
        self: p.role === 'server' && sv.index === serverIndex,
      }),
    ),
    ...workers.map(
      (w): PsLayoutRow => ({
        role: 'worker',
        id: w.workerId,
        name: `worker ${w.workerId}`,
        rank: w.rank,
        tensors: null,
        numel: null,
        holds: '',
        self: p.role === 'worker' && w.workerId === workerId,
      }),
    ),
  ];
  const me = p.role === 'server' ? `server ${serverIndex ?? '?'}` : `worker ${workerId ?? '?'}`;
  const shape = `${plural(p.servers.length, 'server')} · ${plural(p.workers.length, 'worker')} · ${PS_STRATEGY[p.strategy]} · this tab: ${me} (rank ${p.rank})`;

  let server: PsServerPanel | null = null;
  if (p.server) {
    const sv = p.server;
    const info = p.servers.find((x) => x.index === sv.index);
    const shardText = info
      ? `${info.parameters.length ? `tensors ${fmtIndices(info.parameters)}` : 'no tensors'} (${pluralInt(info.numel, 'parameter')})`
      : '–';
    server = {
      index: sv.index,
      shardText,
      version: sv.version,
      updatesPerSec: sv.updatesPerSec,
      figures: [
        { key: 'version', label: 'Model version', value: fmtInt(sv.version) },
        { key: 'updatesPerSec', label: 'Updates/s', value: fmtRate(sv.updatesPerSec) },
        { key: 'applied', label: 'Applied', value: fmtInt(sv.applied) },
        { key: 'stale', label: 'Stale', value: fmtInt(sv.stale) },
        { key: 'duplicate', label: 'Duplicate', value: fmtInt(sv.duplicate) },
        { key: 'refused', label: 'Refused', value: fmtInt(sv.refused) },
      ],
      histogram: psHistogram(sv.stalenessHistogram),
      pushRates: [...sv.pushRates]
        .sort((a, b) => a.workerId - b.workerId)
        .map((r) => ({
          workerId: r.workerId,
          rank: r.rank,
          pushesPerSec: r.pushesPerSec,
          pushes: r.pushes,
          applied: r.applied,
          rateText: fmtRate(r.pushesPerSec),
        })),
    };
  }

  let worker: PsWorkerPanel | null = null;
  if (p.worker) {
    const w = p.worker;
    worker = {
      workerId: w.workerId,
      figures: [
        { key: 'workerId', label: 'Worker', value: `${w.workerId}` },
        { key: 'pulls', label: 'Pulls', value: fmtInt(w.pulls) },
        { key: 'pushes', label: 'Pushes', value: fmtInt(w.pushes) },
        { key: 'applied', label: 'Applied', value: fmtInt(w.applied) },
        { key: 'stale', label: 'Stale', value: fmtInt(w.stale) },
        { key: 'samples', label: 'Samples', value: fmtInt(w.samples) },
        { key: 'lastStaleness', label: 'Last staleness', value: w.lastStaleness === null ? '–' : fmtInt(w.lastStaleness) },
      ],
    };
  }

  let samples: PsSamplesPanel | null = null;
  if (p.samples) {
    const sm = p.samples;
    const fraction = sm.target > 0 ? Math.min(1, Math.max(0, sm.leased / sm.target)) : 0;
    // Epochs as people count them: the first is epoch 1; once every sample is handed out, the epochs done.
    const epochs = s.config && s.config.steps === null ? s.config.epochs : null;
    const epoch = sm.target > 0 && sm.leased >= sm.target ? sm.epoch : sm.epoch + 1;
    const epochText = `${fmtInt(epochs !== null ? Math.min(epoch, epochs) : epoch)}${epochs !== null ? ` of ${epochs}` : ''}`;
    samples = {
      target: sm.target,
      leased: sm.leased,
      fraction,
      leasedText: `Leased ${fmtInt(sm.leased)} of ${pluralInt(sm.target, 'sample')} (${fmtPercent(fraction)}) · virtual epoch ${epochText}`,
      figures: [
        { key: 'applied', label: 'Applied', value: fmtInt(sm.applied) },
        { key: 'stale', label: 'Stale', value: fmtInt(sm.stale) },
        { key: 'refused', label: 'Refused', value: fmtInt(sm.refused), warn: sm.refused > 0 },
        { key: 'lost', label: 'Lost', value: fmtInt(sm.lost), warn: sm.lost > 0 },
        { key: 'epoch', label: 'Virtual epoch', value: epochText },
      ],
      warn: sm.lost > 0 || sm.refused > 0,
    };
  }

  return { strategy: p.strategy, role: p.role, rank: p.rank, shape, layout, server, worker, samples };
}
