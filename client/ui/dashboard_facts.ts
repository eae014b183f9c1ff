/**
 * The facts card's model: this tab's rank, browser and backend, its devices, its data shard and the job.
 */
import type { DeviceInfo, DeviceStats } from '../../src/parallel/data_parallel/data_parallel.ts';
import type { BackendName } from '../train/events.ts';
import type { BackendSetting } from '../../src/jobs/train_config.ts';
import type { DashboardState } from './dashboard_state.ts';
import { epochOf } from './dashboard_format.ts';
import { describeJob } from './dashboard_job.ts';
import { faultHistoryLines, faultSummary } from './dashboard_report.ts';
import { fmtInt, fmtMs } from './format.ts';
import { INSECURE_PAGE_REASON } from '../webgpu.ts';
import { probeText } from '../backend_figures.ts';

export type BackendFact =
  | { kind: 'running'; name: BackendName; detail: string; fallback: string | null; probe: string | null }
  | { kind: 'requested'; name: BackendSetting }
  | { kind: 'unknown' };

export interface Facts {
  rank: { text: string; rank: number | null };
  /** This tab's browser and platform ("Chrome 156 · Android phone"), once its fleet info is known. */
  browser: string;
  backend: BackendFact;
  /** --devices K > 1: one line per device (backend, its share and speed), and its fallback if any; null with one device. */
  devices: Array<{ text: string; fallback: string | null }> | null;
  shard: string;
  job: string;
  /** The group's faults so far (the server's record: the same on every tab), and their list. */
  faults: { text: string; history: string[] };
}

/** The facts card: this tab's rank, its backend, its data shard, the job. */
export function facts(s: DashboardState): Facts {
  const c = s.config;
  let size = '';
  if (s.worldSize !== null) size = ` · world size ${s.worldSize}`;
  else if (c) size = c.min === c.max ? ` · world size ${c.max}` : ` · ${c.min} to ${c.max} tabs`;

  let backend: BackendFact = { kind: 'unknown' };
  const b = s.backend;
  if (b) {
    const cpuOnly = b.name === 'wasm' || b.name === 'cpu';
    // On wasm and cpu a WebGPU adapter the tab has is not what it trains on.
    const detail = cpuOnly ? ' · on the CPU' : b.adapter ? ` · ${b.adapter}` : ' · adapter not reported';
    // The insecure-page reason says all itself (it is the page, not the browser, and what to do).
    const fallback = !b.fallbackReason
      ? null
      : b.fallbackReason.startsWith(INSECURE_PAGE_REASON)
        ? `⚠ ${b.fallbackReason}.`
        : `⚠ Fallback from ${c?.backend ?? 'the requested backend'}: ${b.fallbackReason}`;
    // backend=auto: why this one, in figures.
    const probe = b.probe ? `auto, measured on this model: ${probeText(b.probe, b.name)}` : null;
    backend = { kind: 'running', name: b.name, detail, fallback, probe };
  } else if (c) {
    backend = { kind: 'requested', name: c.backend };
  }

  const sh = s.shard;
  const mine = s.self === null ? undefined : s.fleet.find((m) => m.rank === s.self);
  return {
    rank: {
      text: s.self !== null ? `rank ${s.self}${size}` : s.role.spectator ? `watching, no rank yet${size}` : `joining…${size}`,
      rank: s.self,
    },
    browser: mine ? [mine.browser, mine.platform].filter(Boolean).join(' · ') : '–',
    backend,
    devices: s.devices === null ? null : s.devices.map(deviceFact),
    // Balanced batches split each step's samples by the tabs' speeds: no rank holds a fixed shard.
    shard: !sh
      ? '–'
      : c?.balance && (s.worldSize ?? 1) > 1
        ? `${fmtInt(sh.datasetSize)} samples shared by speed, step by step · epoch ${epochOf(s, sh.epoch)} · ${fmtInt(sh.stepsPerEpoch)} steps/epoch`
        : `${fmtInt(sh.samples)} of ${fmtInt(sh.datasetSize)} samples · epoch ${epochOf(s, sh.epoch)} · ${fmtInt(sh.stepsPerEpoch)} steps/epoch`,
    job: c ? describeJob(c) : '–',
    faults: { text: faultSummary(s), history: faultHistoryLines(s) },
  };
}

/** "device 1: cpu · 1,024 samples · 12.3 ms/step", and its fallback reason. */
function deviceFact(d: DeviceInfo & Partial<DeviceStats>): { text: string; fallback: string | null } {
  const figures = d.steps ? ` · ${fmtInt(d.samples ?? 0)} samples · ${d.meanComputeMs == null ? '–' : fmtMs(d.meanComputeMs)}/step` : '';
  return { text: `device ${d.device}: ${d.backend}${figures}`, fallback: d.fallbackReason ? `⚠ ${d.fallbackReason}` : null };
}
