/**
 * The launcher's summary of the ranks' devices (--devices): `devices` and, with Workers, each
 * rank's `deviceReports`, checked field by field, and the line printed before the JSON. Fake
 * ranks' results, as the pages report them.
 */
import { describe, expect, it } from 'vitest';
import { summarize } from '../launcher/summaries.ts';
import { devicesLine, devicesSummary } from '../launcher/summary_devices.ts';
import type { RankResult } from '../launcher/summary_fields.ts';

const device = (d: number, over: Record<string, unknown> = {}) => ({
  device: d,
  backend: 'cpu',
  steps: 15,
  samples: 240,
  meanComputeMs: 12.345,
  liveTensors: { min: 4, max: 4 },
  ...over,
});

function rank(r: number, over: Record<string, unknown> = {}): RankResult {
  return {
    rank: r,
    worldSize: 2,
    backend: 'cpu',
    steps: 15,
    weightHash: 'same',
    seconds: 3,
    devices: 2,
    deviceReports: [device(0), device(1)],
    ...over,
  };
}

describe('a run’s devices in the summary', () => {
  it('says the devices per rank and each rank’s devices, rounded', () => {
    const s = summarize('train', 2, [rank(1), rank(0)]);
    expect(s.devices).toBe(2);
    expect(s.deviceReports).toEqual([
      { rank: 0, devices: [device(0, { meanComputeMs: 12.35 }), device(1, { meanComputeMs: 12.35 })] },
      { rank: 1, devices: [device(0, { meanComputeMs: 12.35 }), device(1, { meanComputeMs: 12.35 })] },
    ]);
    expect(devicesLine(s)).toBe(
      'devices: 2 per rank; rank 0: device 0 cpu 12.35 ms/step, 240 samples; device 1 cpu 12.35 ms/step, 240 samples | rank 1: device 0 cpu 12.35 ms/step, 240 samples; device 1 cpu 12.35 ms/step, 240 samples',
    );
  });

  it('with one device per rank says only that, and prints no line', () => {
    const s = devicesSummary([rank(0, { devices: 1, deviceReports: undefined })]);
    expect(s).toEqual({ devices: 1 });
    expect(devicesLine(s as Record<string, unknown>)).toBeNull();
  });

  it('is empty for ranks that report no devices (pipelines, parameter servers)', () => {
    expect(devicesSummary([{ rank: 0 }])).toEqual({});
  });

  it('drops what a page made up: unknown backends, negative counts, and keeps a fallback reason short', () => {
    const s = devicesSummary([
      rank(0, {
        deviceReports: [
          device(0, { backend: 'tpu' }),
          device(1, { steps: -3, liveTensors: { min: 'x', max: 1 }, fallbackReason: 'w'.repeat(2000) }),
          'junk',
        ],
      }),
    ]);
    expect(s.deviceReports![0]!.devices).toEqual([
      { ...device(1, { meanComputeMs: 12.35 }), steps: 0, liveTensors: null, fallbackReason: 'w'.repeat(500) },
    ]);
  });
});
