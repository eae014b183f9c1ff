/**
 * The Parameter server card as a person reads it, replayed through the dashboard's pure reducer
 * (client/ui/dashboard_state.ts): the 'ps' status is kept, the log says this tab's role and a new
 * layout once (not every second), warns when samples are lost or refused, and the card's model
 * (psPanel) gives the layout, a server's shard with its staleness histogram and push rates, a
 * worker's figures, and the samples. No DOM: the views draw these figures as they are.
 */
import { describe, expect, it } from 'vitest';
import type { PsSamples, PsStatusEvent, TrainConfig, TrainEvent } from '../client/train/events.ts';
import { initialDashboardState, reduceDashboard, type DashboardEvent, type DashboardState } from '../client/ui/dashboard_state.ts';
import { fmtIndices, psHistogram, psPanel } from '../client/ui/dashboard_ps.ts';

const T0 = Date.UTC(2024, 0, 1, 12, 0, 0);

function replay(events: DashboardEvent[], from: DashboardState = initialDashboardState({ session: 's', at: T0 })): DashboardState {
  let s = from;
  let at = (s.log[0]?.at ?? T0) + 1000;
  for (const event of events) {
    s = reduceDashboard(s, { at, event });
    at += 1000;
  }
  return s;
}

const messages = (s: DashboardState) => s.log.map((e) => e.message);

const samples = (over: Partial<PsSamples> = {}): PsSamples => ({
  target: 60_000,
  leased: 12_000,
  applied: 11_500,
  stale: 20,
  refused: 0,
  lost: 0,
  epoch: 0,
  ...over,
});

/** 1 server (rank 0) holding tensors 0 and 1 (101,770 parameters), and 3 workers. */
const servers: PsStatusEvent['servers'] = [{ index: 0, rank: 0, parameters: [0, 1], numel: 101_770 }];
const workers: PsStatusEvent['workers'] = [
  { workerId: 1, rank: 1 },
  { workerId: 3, rank: 2 },
  { workerId: 2, rank: 3 },
];

function serverEvent(over: Partial<PsStatusEvent> = {}, serverOver: Partial<NonNullable<PsStatusEvent['server']>> = {}): PsStatusEvent {
  return {
    type: 'ps',
    strategy: 'async',
    rank: 0,
    role: 'server',
    servers,
    workers,
    server: {
      index: 0,
      version: 1234,
      updatesPerSec: 45.25,
      applied: 1234,
      stale: 7,
      duplicate: 1,
      refused: 2,
      stalenessHistogram: [100, 300, 14, 0, 0, 0, 0, 0, 0, 0, 0, 3],
      pushRates: [
        { workerId: 3, rank: 2, pushesPerSec: 15.4, pushes: 400, applied: 398 },
        { workerId: 1, rank: 1, pushesPerSec: 2.25, pushes: 500, applied: 500 },
        { workerId: 0, rank: null, pushesPerSec: 0, pushes: 336, applied: 336 },
      ],
      ...serverOver,
    },
    samples: samples(),
    ...over,
  };
}

function workerEvent(over: Partial<PsStatusEvent> = {}): PsStatusEvent {
  return {
    type: 'ps',
    strategy: 'async',
    rank: 2,
    role: 'worker',
    servers,
    workers,
    worker: { workerId: 3, pulls: 401, pushes: 400, applied: 398, stale: 2, samples: 25_600, lastStaleness: 2 },
    samples: null,
    ...over,
  };
}

function config(over: Partial<TrainConfig> = {}): TrainConfig {
  return {
    model: 'mlp',
    hidden: null,
    dataset: 'mnist',
    local: null,
    context: null,
    streamData: 'auto',
    batchSize: 64,
    lr: 0.003,
    optimizer: 'adam',
    epochs: 5,
    steps: null,
    timeLimit: null,
    trainSize: 0,
    testSize: 0,
    seed: 0,
    shuffle: true,
    balance: true,
    voteWithGradients: true,
    backend: 'webgpu',
    min: 4,
    max: 4,
    checkpointEvery: 0,
    evalEvery: 100,
    firstSample: 0,
    resumeFrom: null,
    pp: 1,
    dp: 1,
    microBatches: 1,
    schedule: 'gpipe',
    activationDtype: 'float32',
    splitPoints: null,
    slow: null,
    strategy: 'ps',
    ps: 1,
    maxStaleness: null,
    stalenessLr: false,
    commHook: { kind: 'none' },
    devices: 1,
    linkWindowBytes: null,
    aggregation: { kind: 'mean' },
    attack: null,
    ...over,
  };
}

describe('the ps state', () => {
  it('is null until a parameter-server run says otherwise, and there is no card', () => {
    const s = replay([
      { type: 'config', config: config() },
      { type: 'joined', rank: 0, worldSize: 4, backend: 'webgpu', adapter: null },
    ]);
    expect(s.ps).toBeNull();
    expect(psPanel(s)).toBeNull();
  });

  it("keeps the latest 'ps' event as it came (without its type), replaced each second", () => {
    const first = serverEvent();
    const s = replay([first]);
    const { type: _type, ...kept } = first;
    expect(s.ps).toEqual(kept);
    const second = serverEvent({}, { version: 1300, applied: 1300 });
    const t = replay([second], s);
    expect(t.ps!.server!.version).toBe(1300);
    expect(t.ps).not.toBe(s.ps);
  });

  it('keeps the samples it heard when an update has not heard them', () => {
    const s = replay([workerEvent({ samples: samples({ leased: 3000 }) }), workerEvent({ samples: null })]);
    expect(s.ps!.samples).toEqual(samples({ leased: 3000 }));
    expect(replay([workerEvent()]).ps!.samples).toBeNull();
  });

  it('survives a new group: the next status replaces it', () => {
    const s = replay([
      { type: 'joined', rank: 2, worldSize: 4, backend: 'webgpu', adapter: null },
      workerEvent(),
      { type: 'joined', rank: 1, worldSize: 3, backend: 'webgpu', adapter: null },
    ]);
    expect(s.ps!.rank).toBe(2);
  });
});

describe('the log', () => {
  it("says a server tab's role once, not on every update", () => {
    const s = replay([serverEvent(), serverEvent({}, { version: 1300 }), serverEvent({}, { version: 1400 })]);
    const lines = messages(s).filter((m) => /parameter server|worker/i.test(m));
    expect(lines).toEqual(['Parameter server 0 of 1 on this tab: 2 tensors, 101,770 parameters.']);
  });

  it("says a worker tab's role once, and again when its rank or role changes", () => {
    const s = replay([
      workerEvent(),
      workerEvent(),
      workerEvent({ worker: { workerId: 3, pulls: 500, pushes: 499, applied: 490, stale: 9, samples: 31_936, lastStaleness: 0 } }),
    ]);
    expect(messages(s).filter((m) => m.startsWith('Worker'))).toEqual(['Worker 3 (rank 2) of 3, pulling from 1 server.']);
    // Renumbered in a new group: rank 1 now.
    const moved = replay(
      [
        workerEvent({
          rank: 1,
          workers: [
            { workerId: 1, rank: 2 },
            { workerId: 3, rank: 1 },
            { workerId: 2, rank: 3 },
          ],
        }),
      ],
      s,
    );
    expect(moved.log[0]!.message).toBe('Worker 3 (rank 1) of 3, pulling from 1 server.');
    expect(moved.log.length).toBe(s.log.length + 1);
    // Without its own figures yet, the worker id comes from the layout.
    const early = replay([workerEvent({ worker: undefined })]);
    expect(early.log[0]!.message).toBe('Worker 3 (rank 2) of 3, pulling from 1 server.');
  });

  it('says a new layout once when a worker leaves or comes, with the role unchanged', () => {
    const s = replay([serverEvent()]);
    const left = replay([serverEvent({ workers: workers.slice(0, 2) }), serverEvent({ workers: workers.slice(0, 2) })], s);
    expect(left.log.length).toBe(s.log.length + 1);
    expect(left.log[0]).toMatchObject({
      level: 'info',
      message: 'Parameter-server layout now: 1 server (server 0 on rank 0), 2 workers (worker 1 on rank 1, worker 3 on rank 2).',
    });
    const back = replay([serverEvent()], left);
    expect(back.log[0]!.message).toMatch(/^Parameter-server layout now: .*3 workers/);
  });

  it('warns when samples are lost with a worker that left, by how many more, once', () => {
    const s = replay([serverEvent()]);
    const lost = replay(
      [serverEvent({ samples: samples({ lost: 4 }) }), serverEvent({ samples: samples({ lost: 4, leased: 12_100 }) })],
      s,
    );
    const warnings = lost.log.filter((e) => e.level === 'warn');
    expect(warnings.map((e) => e.message)).toEqual(['4 samples lost with a worker that left.']);
    const more = replay([serverEvent({ samples: samples({ lost: 5 }) })], lost);
    expect(more.log[0]).toMatchObject({ level: 'warn', message: '1 sample lost with a worker that left.' });
  });

  it('warns when samples are refused', () => {
    const s = replay([workerEvent({ samples: samples() }), workerEvent({ samples: samples({ refused: 64 }) })]);
    expect(s.log[0]).toMatchObject({
      level: 'warn',
      message: '64 samples refused by the parameter server: pushed malformed, or for a version it no longer has.',
    });
    expect(replay([workerEvent({ samples: samples({ refused: 64 }) })], s).log.length).toBe(s.log.length);
  });

  it('does not warn when the figures go down (a restored run) or stay at zero', () => {
    const s = replay([serverEvent({ samples: samples({ lost: 8 }) })]);
    const restored = replay(
      [serverEvent({ samples: samples({ lost: 0, leased: 0 }) }), serverEvent({ samples: samples({ lost: 0, leased: 100 }) })],
      s,
    );
    expect(restored.log.length).toBe(s.log.length);
  });
});

describe('the Parameter server card', () => {
  it('lists the servers and the workers with their ranks now, and marks this tab', () => {
    const p = psPanel(replay([workerEvent()]))!;
    expect(p.role).toBe('worker');
    expect(p.layout.map(({ role, id, rank, tensors, numel, holds, self }) => ({ role, id, rank, tensors, numel, holds, self }))).toEqual([
      { role: 'server', id: 0, rank: 0, tensors: 2, numel: 101_770, holds: 'tensors 0, 1', self: false },
      { role: 'worker', id: 1, rank: 1, tensors: null, numel: null, holds: '', self: false },
      { role: 'worker', id: 2, rank: 3, tensors: null, numel: null, holds: '', self: false },
      { role: 'worker', id: 3, rank: 2, tensors: null, numel: null, holds: '', self: true },
    ]);
    expect(p.shape).toBe('1 server · 3 workers · asynchronous: each worker pushes when it is ready · this tab: worker 3 (rank 2)');
    const server = psPanel(replay([serverEvent({ strategy: 'central' })]))!;
    expect(server.layout.filter((r) => r.self).map((r) => r.name)).toEqual(['server 0']);
    expect(server.shape).toMatch(/^1 server · 3 workers · central, synchronous: .* · this tab: server 0 \(rank 0\)$/);
  });

  it("on a server tab: its shard, version, rate and verdicts, each worker's pushes", () => {
    const p = psPanel(replay([serverEvent()]))!;
    expect(p.worker).toBeNull();
    const sv = p.server!;
    expect(sv.shardText).toBe('tensors 0, 1 (101,770 parameters)');
    expect(sv.figures.map((f) => [f.label, f.value])).toEqual([
      ['Model version', '1,234'],
      ['Updates/s', '45'],
      ['Applied', '1,234'],
      ['Stale', '7'],
      ['Duplicate', '1'],
      ['Refused', '2'],
    ]);
    expect(sv.pushRates.map((r) => [r.workerId, r.rank, r.rateText, r.pushes, r.applied])).toEqual([
      [0, null, '0.0', 336, 336],
      [1, 1, '2.3', 500, 500],
      [3, 2, '15', 400, 398],
    ]);
  });

  it('the staleness histogram: a bar per bucket up to the last with pushes, labelled, the last bucket "N+"', () => {
    const h = psPanel(replay([serverEvent()]))!.server!.histogram;
    expect(h.total).toBe(417);
    expect(h.bars.map((b) => b.label)).toEqual(['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11+']);
    expect(h.bars[2]).toMatchObject({ staleness: 2, count: 14, tail: false, ariaLabel: 'staleness 2: 14 pushes' });
    expect(h.bars[1]!.height).toBe(1);
    expect(h.bars[0]!.height).toBeCloseTo(1 / 3);
    expect(h.bars[11]).toMatchObject({ tail: true, ariaLabel: 'staleness 11+: 3 pushes' });
    expect(h.caption).toMatch(/^417 pushes applied or dropped as stale, by staleness/);
    // Trailing empty buckets are left out (at least 8 drawn); "N+" only on the histogram's last bucket.
    const young = psHistogram([5, 1, ...new Array<number>(30).fill(0)]);
    expect(young.bars.map((b) => b.label)).toEqual(['0', '1', '2', '3', '4', '5', '6', '7']);
    expect(young.bars[1]!.ariaLabel).toBe('staleness 1: 1 push');
    expect(psHistogram(new Array<number>(32).fill(0).map((_, i) => (i === 31 ? 2 : 0))).bars.at(-1)!.ariaLabel).toBe(
      'staleness 31+: 2 pushes',
    );
    expect(psHistogram([]).bars).toEqual([]);
    expect(psHistogram([0, 0]).caption).toBe('No pushes yet.');
  });

  it('on a worker tab: its id, pulls, pushes, verdicts, samples and last staleness', () => {
    const p = psPanel(replay([workerEvent()]))!;
    expect(p.server).toBeNull();
    expect(p.worker!.figures.map((f) => [f.label, f.value])).toEqual([
      ['Worker', '3'],
      ['Pulls', '401'],
      ['Pushes', '400'],
      ['Applied', '398'],
      ['Stale', '2'],
      ['Samples', '25,600'],
      ['Last staleness', '2'],
    ]);
    const first = psPanel(
      replay([workerEvent({ worker: { workerId: 3, pulls: 1, pushes: 0, applied: 0, stale: 0, samples: 0, lastStaleness: null } })]),
    )!;
    expect(first.worker!.figures.at(-1)!.value).toBe('–');
  });

  it('the samples line: leased of the target, the verdicts, the virtual epoch as people count it; none before they are heard', () => {
    expect(psPanel(replay([workerEvent()]))!.samples).toBeNull();
    const s = replay([{ type: 'config', config: config() }, serverEvent({ samples: samples({ lost: 4 }) })]);
    const sm = psPanel(s)!.samples!;
    expect(sm.fraction).toBeCloseTo(0.2);
    expect(sm.leasedText).toBe('Leased 12,000 of 60,000 samples (20.0%) · virtual epoch 1 of 5');
    expect(sm.figures.map((f) => [f.label, f.value, f.warn ?? false])).toEqual([
      ['Applied', '11,500', false],
      ['Stale', '20', false],
      ['Refused', '0', false],
      ['Lost', '4', true],
      ['Virtual epoch', '1 of 5', false],
    ]);
    expect(sm.warn).toBe(true);
    const done = psPanel(replay([serverEvent({ samples: samples({ leased: 60_000, epoch: 5 }) })], s))!.samples!;
    expect(done.fraction).toBe(1);
    expect(done.leasedText).toBe('Leased 60,000 of 60,000 samples (100.0%) · virtual epoch 5 of 5');
  });

  it('indices read as runs', () => {
    expect(fmtIndices([6, 0, 1, 2, 3, 8, 9, 9])).toBe('0–3, 6, 8, 9');
    expect(fmtIndices([])).toBe('');
  });
});

// The events type-check as TrainEvents.
const _events: TrainEvent[] = [serverEvent(), workerEvent()];
void _events;
