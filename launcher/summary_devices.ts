/** A DDP run's devices per rank in its summary (--devices), and the launcher's line about them. */
import { count, record, rounded, type RankResult } from './summary_fields.ts';

/** One device of a rank (--devices K > 1), as the launcher reports it. */
export interface DeviceReport {
  device: number;
  backend: string;
  fallbackReason?: string;
  steps: number;
  samples: number;
  /** Mean compute per step on the device, ms (null before any step). */
  meanComputeMs: number | null;
  /** Live tensors on the device after its steps: equal when nothing leaks (null before any step). */
  liveTensors: { min: number; max: number } | null;
}

/** --devices in a DDP run's summary (see devicesSummary). */
export interface DevicesSummary {
  /** Devices per rank (rank 0's; 1 unless --devices). */
  devices?: number;
  /** With more than one: each rank's devices, their backends and figures. */
  deviceReports?: Array<{ rank: number; devices: DeviceReport[] }>;
}

const DEVICE_BACKEND_NAMES = new Set(['webgpu', 'webgl', 'wasm', 'cpu']);

/** A page's `deviceReports` entry, checked field by field (a page's result is its own to fill); null when it is not one. */
function deviceReport(v: unknown): DeviceReport | null {
  const d = record(v);
  if (!d || count(d.device) === null || typeof d.backend !== 'string' || !DEVICE_BACKEND_NAMES.has(d.backend)) return null;
  const tensors = record(d.liveTensors);
  return {
    device: d.device as number,
    backend: d.backend,
    ...(typeof d.fallbackReason === 'string' ? { fallbackReason: d.fallbackReason.slice(0, 500) } : {}),
    steps: count(d.steps) ?? 0,
    samples: count(d.samples) ?? 0,
    meanComputeMs: rounded(d.meanComputeMs),
    liveTensors:
      tensors && count(tensors.min) !== null && count(tensors.max) !== null
        ? { min: tensors.min as number, max: tensors.max as number }
        : null,
  };
}

/**
 * A DDP run's devices per rank (`devices`, rank 0's) and, when a rank had more than one, each
 * rank's devices with their backends and figures (`deviceReports`). Empty for runs whose ranks
 * report no `devices` (pipelines, parameter servers).
 */
export function devicesSummary(ranks: RankResult[]): DevicesSummary {
  const devices = ranks.map((r) => count(r.devices)).find((d) => d !== null);
  if (devices === undefined) return {};
  const reports = ranks
    .filter((r) => Array.isArray(r.deviceReports))
    .map((r) => ({ rank: r.rank, devices: (r.deviceReports as unknown[]).map(deviceReport).filter((d): d is DeviceReport => d !== null) }));
  return { devices, ...(reports.length > 0 ? { deviceReports: reports } : {}) };
}

/** The launcher's line about the ranks' devices (--devices K > 1): each device's backend and compute per step. Null with one device per rank. */
export function devicesLine(summary: Record<string, unknown>): string | null {
  const reports = summary.deviceReports as DevicesSummary['deviceReports'];
  if (!reports || reports.length === 0) return null;
  const rank = (r: { rank: number; devices: DeviceReport[] }) =>
    `rank ${r.rank}: ${r.devices.map((d) => `device ${d.device} ${d.backend}${d.fallbackReason ? ' (fallback)' : ''} ${d.meanComputeMs ?? 'n/a'} ms/step, ${d.samples} samples`).join('; ')}`;
  return `devices: ${String(summary.devices)} per rank; ${reports.map(rank).join(' | ')}`;
}
