/**
 * The fleet: each rank's browser, backend and device, carried through the store (bounded and
 * cleaned, since every byte from another tab is untrusted), and the dashboard's fleet table
 * (its rows, step times and each rank's share of the global batch).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { PrefixStore, type StoreClient } from '../src/c10d/store.ts';
import {
  FLEET_TEXT_LIMITS,
  FleetSharer,
  MAX_FLEET_VALUE_BYTES,
  cleanText,
  deviceText,
  encodeFleetInfo,
  fleetKey,
  parseFleetInfo,
  parseFleetMembers,
  type FleetEvent,
  type FleetInfo,
} from '../client/train/fleet.ts';
import { parseEvents } from '../client/train/spectator.ts';
import type { RankStepMetrics, TrainEvent } from '../client/train/events.ts';
import { parseTrainConfig } from '../src/jobs/train_config.ts';
import { initialDashboardState, reduceDashboard, type DashboardEvent, type DashboardState } from '../client/ui/dashboard_state.ts';
import { facts } from '../client/ui/dashboard_facts.ts';
import { fleetRows } from '../client/ui/dashboard_fleet.ts';
import { connect, withServer } from './fixtures/server.ts';
import { uniqueSession } from './fixtures/session.ts';

const PHONE: FleetInfo = {
  browser: 'Chrome 156',
  platform: 'Android phone',
  mobile: true,
  backend: 'webgl',
  device: 'Mali-G715',
  fallback: 'this browser has no WebGPU',
  memoryGB: 4,
};
const LAPTOP: FleetInfo = {
  browser: 'Firefox 128',
  platform: 'Linux',
  mobile: false,
  backend: 'cpu',
  device: 'CPU, 8 threads',
  fallback: null,
  memoryGB: null,
};

describe('cleanText', () => {
  it('keeps plain text, trims and collapses spaces', () => {
    expect(cleanText('  Chrome   156 ', 48)).toBe('Chrome 156');
  });

  it('turns control and formatting characters (bidi overrides, zero-width) into spaces', () => {
    expect(cleanText('evil\u202Egnp.exe', 48)).toBe('evil gnp.exe');
    expect(cleanText('a\u0000b\nc\u200Bd\u2028e', 48)).toBe('a b c d e');
  });

  it('caps the length in characters, with an ellipsis', () => {
    const cut = cleanText('x'.repeat(10_000), 48)!;
    expect(Array.from(cut)).toHaveLength(48);
    expect(cut.endsWith('…')).toBe(true);
    // Astral characters count as one each and are never split.
    expect(Array.from(cleanText('😀'.repeat(100), 10)!)).toHaveLength(10);
  });

  it('is null for what is not text or holds nothing', () => {
    for (const v of [null, undefined, 42, {}, ['a'], '   ', '\u0000\u0001']) expect(cleanText(v, 10)).toBeNull();
  });
});

describe('fleet values in the store', () => {
  it("round-trips a rank's info", () => {
    expect(parseFleetInfo(new TextEncoder().encode(encodeFleetInfo(PHONE)))).toEqual(PHONE);
    expect(parseFleetInfo(encodeFleetInfo(LAPTOP))).toEqual(LAPTOP);
  });

  it("drops what is not a rank's info: too long, not JSON, not an object, an unknown backend", () => {
    expect(parseFleetInfo(JSON.stringify({ ...PHONE, pad: 'x'.repeat(MAX_FLEET_VALUE_BYTES) }))).toBeNull();
    expect(parseFleetInfo('not json')).toBeNull();
    expect(parseFleetInfo('[1,2]')).toBeNull();
    expect(parseFleetInfo('null')).toBeNull();
    expect(parseFleetInfo(JSON.stringify({ ...PHONE, backend: 'quantum' }))).toBeNull();
    expect(parseFleetInfo(new Uint8Array([0xff, 0xfe, 0x00]))).toBeNull();
  });

  it('cleans and caps every string another tab sends, and sane-checks the memory', () => {
    const hostile = {
      browser: '<img src=x onerror=alert(1)>'.repeat(20),
      platform: 7,
      mobile: 'yes',
      backend: 'cpu',
      device: '\u202E'.repeat(3) + 'd'.repeat(500),
      fallback: 'f'.repeat(500),
      memoryGB: -1,
    };
    const got = parseFleetInfo(JSON.stringify(hostile))!;
    expect(Array.from(got.browser).length).toBeLessThanOrEqual(FLEET_TEXT_LIMITS.browser);
    // Markup stays text: the page sets it with textContent, and it is capped.
    expect(got.browser.startsWith('<img src=x')).toBe(true);
    expect(got.platform).toBeNull();
    expect(got.mobile).toBe(false);
    expect(Array.from(got.device!).length).toBeLessThanOrEqual(FLEET_TEXT_LIMITS.device);
    expect(got.device!.startsWith('d')).toBe(true);
    expect(Array.from(got.fallback!).length).toBeLessThanOrEqual(FLEET_TEXT_LIMITS.fallback);
    expect(got.memoryGB).toBeNull();
    expect(parseFleetInfo(JSON.stringify({ backend: 'cpu' }))!.browser).toBe('unknown browser');
    expect(parseFleetInfo(JSON.stringify({ ...LAPTOP, memoryGB: Infinity }))!.memoryGB).toBeNull();
  });

  it("checks a published event's members: ranks in the group, each once, each valid", () => {
    const members = [
      { rank: 1, ...LAPTOP },
      { rank: 0, ...PHONE },
    ];
    expect(parseFleetMembers(members, 2)!.map((m) => m.rank)).toEqual([0, 1]);
    expect(parseFleetMembers(members, 1)).toBeNull(); // more members than ranks
    expect(parseFleetMembers([{ rank: 2, ...PHONE }], 2)).toBeNull();
    expect(
      parseFleetMembers(
        [
          { rank: 0, ...PHONE },
          { rank: 0, ...LAPTOP },
        ],
        2,
      ),
    ).toBeNull();
    expect(parseFleetMembers([{ rank: 0.5, ...PHONE }], 2)).toBeNull();
    expect(parseFleetMembers([{ rank: 0, ...PHONE, backend: 'x' }], 2)).toBeNull();
    expect(parseFleetMembers('nope', 2)).toBeNull();
  });

  it('names the device the rank trains on', () => {
    expect(deviceText('webgpu', 'google swiftshader', null, 8)).toBe('google swiftshader');
    expect(deviceText('webgl', null, 'ANGLE (Google, Vulkan 1.3.0 (SwiftShader Device), SwiftShader driver)', 8)).toBe(
      'Google, Vulkan 1.3.0 (SwiftShader Device), SwiftShader driver',
    );
    // A WebGPU adapter the tab does not train on says nothing about its device.
    expect(deviceText('cpu', 'google swiftshader', null, 8)).toBe('CPU, 8 threads');
    expect(deviceText('wasm', null, null, null)).toBe('CPU');
  });
});

describe('FleetSharer over the real store', () => {
  let server: RunningServer;
  const clients: StoreClient[] = [];
  beforeAll(async () => {
    server = await withServer();
  });
  afterAll(async () => {
    for (const c of clients) c.close();
    await server.close();
  });

  const group = async (session: string, prefix: string, rank: number, worldSize: number) => {
    const client = await connect(server, session);
    clients.push(client);
    return { rank, worldSize, store: new PrefixStore(prefix, client) };
  };

  it('every rank hears every rank, once all have said', async () => {
    const session = uniqueSession('fleet');
    const infos = [PHONE, LAPTOP, { ...LAPTOP, browser: 'Safari 17', platform: 'macOS' }];
    const heard: FleetEvent[][] = [[], [], []];
    const groups = await Promise.all(infos.map((_, r) => group(session, 'pg/a.1', r, 3)));
    await Promise.all(groups.map((g, r) => new FleetSharer(5_000).share(g, infos[r]!, (e) => heard[r]!.push(e))));
    for (let r = 0; r < 3; r++) {
      // First its own entry at once, then the whole group.
      expect(heard[r]![0]!.members).toEqual([{ rank: r, ...infos[r] }]);
      const last = heard[r]!.at(-1)!;
      expect(last.worldSize).toBe(3);
      expect(last.members).toEqual(infos.map((info, rank) => ({ rank, ...info })));
    }
  });

  it('a rank that never says is left out after the wait; a hostile value is dropped', async () => {
    const session = uniqueSession('fleet');
    const [g0, g2] = await Promise.all([group(session, 'pg/b.1', 0, 3), group(session, 'pg/b.1', 2, 3)]);
    await g2.store.set(fleetKey(2), JSON.stringify({ backend: 'rocket' }));
    const heard: FleetEvent[] = [];
    await new FleetSharer(300).share(g0, PHONE, (e) => heard.push(e));
    expect(heard.at(-1)!.members).toEqual([{ rank: 0, ...PHONE }]);
  });

  it("a value too large for one reply hides nobody else's", async () => {
    // A server whose replies are at most 256 KiB: the multiGet of all three keys is refused.
    const small = await withServer({ limits: { maxReplyBytes: 256 * 1024 } });
    try {
      const session = uniqueSession('fleet');
      const [g0, g1, g2] = await Promise.all(
        [0, 1, 2].map(async (rank) => {
          const client = await connect(small, session);
          clients.push(client);
          return { rank, worldSize: 3, store: new PrefixStore('pg/d.1', client) };
        }),
      );
      // Rank 2 (hostile) writes far past the fleet's bound and the reply limit.
      await Promise.all([g2!.store.set(fleetKey(2), 'x'.repeat(300 * 1024)), new FleetSharer(5_000).share(g1!, LAPTOP, () => {})]);
      const heard: FleetEvent[] = [];
      await new FleetSharer(5_000).share(g0!, PHONE, (e) => heard.push(e));
      expect(heard.at(-1)!.members).toEqual([
        { rank: 0, ...PHONE },
        { rank: 1, ...LAPTOP },
      ]);
    } finally {
      await small.close();
    }
  });

  it("a new round removes the rank's key of the old one, and drops what comes late for it", async () => {
    const session = uniqueSession('fleet');
    const sharer = new FleetSharer(2_000);
    const heard: FleetEvent[] = [];
    const old = await group(session, 'pg/c.1', 1, 2);
    // Round 1 waits for rank 0, which never comes; round 2 starts meanwhile.
    const first = sharer.share(old, LAPTOP, (e) => heard.push(e));
    await expect.poll(() => old.store.check([fleetKey(1)])).toBe(true);
    const next = await group(session, 'pg/c.2', 0, 1);
    await sharer.share(next, LAPTOP, (e) => heard.push(e));
    await first;
    expect(await old.store.check([fleetKey(1)])).toBe(false);
    expect(await next.store.check([fleetKey(0)])).toBe(true);
    // Round 1's own entry, then round 2's; nothing of round 1 after round 2 began.
    expect(heard.map((e) => e.worldSize)).toEqual([2, 1]);
  });
});

// ---------------------------------------------------------------- the dashboard's fleet table

const T0 = Date.UTC(2024, 0, 1, 12, 0, 0);

function replay(events: DashboardEvent[], from?: DashboardState): DashboardState {
  let s = from ?? initialDashboardState({ session: 'fleet', at: T0 });
  events.forEach((event, i) => {
    s = reduceDashboard(s, { at: T0 + 1000 * (i + 1), event });
  });
  return s;
}

function rankStep(rank: number, over: Partial<RankStepMetrics> = {}): RankStepMetrics {
  return {
    rank,
    loss: 1,
    accuracy: 0.5,
    samplesPerSec: 100,
    breakdownMs: { compute: 10 * (rank + 1), readback: 1, allreduce: 5, apply: 1 },
    ...over,
  };
}

function step(n: number, ranks: RankStepMetrics[]): TrainEvent {
  return { type: 'step', epoch: 0, step: n, totalSteps: 100, ranks, elapsedSec: n };
}

const joined = (rank: number, worldSize: number): TrainEvent => ({ type: 'joined', rank, worldSize, backend: 'cpu', adapter: null });
const fleet = (worldSize: number, members: Array<[number, FleetInfo]>): TrainEvent => ({
  type: 'fleet',
  worldSize,
  members: members.map(([rank, info]) => ({ rank, ...info })),
});

describe('the fleet table', () => {
  it('lists every rank of the group, with what each said and its step time', () => {
    const s = replay([
      joined(1, 2),
      fleet(2, [[1, LAPTOP]]),
      fleet(2, [
        [0, PHONE],
        [1, LAPTOP],
      ]),
      step(1, [rankStep(0), rankStep(1)]),
    ]);
    const rows = fleetRows(s);
    expect(rows.map((r) => r.rank)).toEqual([0, 1]);
    expect(rows[0]).toMatchObject({
      self: false,
      browser: 'Chrome 156',
      platform: 'Android phone',
      backend: 'webgl',
      fallback: 'this browser has no WebGPU',
      device: 'Mali-G715 · 4 GB RAM',
      stepMs: 17,
      computeMs: 10,
    });
    expect(rows[1]).toMatchObject({
      self: true,
      browser: 'Firefox 128',
      platform: 'Linux',
      backend: 'cpu',
      fallback: null,
      device: 'CPU, 8 threads',
      stepMs: 27,
    });
    // The facts card says this tab's browser.
    expect(facts(s).browser).toBe('Firefox 128 · Linux');
    // Said once in the log, when the whole group is known.
    expect(s.log.filter((e) => e.message.startsWith("The group's tabs")).map((e) => e.message)).toEqual([
      "The group's tabs: rank 0 on Chrome 156 (Android phone), webgl (a fallback); rank 1 on Firefox 128 (Linux), cpu.",
    ]);
  });

  it("shows a rank that has not said yet, and this tab's own backend before its info arrives", () => {
    const rows = fleetRows(replay([joined(0, 3)]));
    expect(rows.map((r) => [r.rank, r.browser, r.backend, r.share])).toEqual([
      [0, null, 'cpu', null],
      [1, null, null, null],
      [2, null, null, null],
    ]);
  });

  it('splits the batch evenly while the ranks do not report their samples', () => {
    const s = replay([
      joined(0, 4),
      step(
        1,
        [0, 1, 2, 3].map((r) => rankStep(r)),
      ),
    ]);
    expect(fleetRows(s).map((r) => [r.share, r.shareEven])).toEqual(Array.from({ length: 4 }, () => [0.25, true]));
  });

  it('gives each rank samples / sum over ranks, over the recent steps, when they report samples', () => {
    const s = replay([
      joined(0, 2),
      step(1, [rankStep(0, { samples: 48 }), rankStep(1, { samples: 16 })]),
      step(2, [rankStep(0, { samples: 40 }), rankStep(1, { samples: 24 })]),
    ]);
    expect(fleetRows(s).map((r) => [r.share, r.shareEven])).toEqual([
      [88 / 128, false],
      [40 / 128, false],
    ]);
    // One rank without the figure (an older page): even shares rather than a wrong split.
    const mixed = replay([step(3, [rankStep(0, { samples: 48 }), rankStep(1)])], s);
    expect(fleetRows(mixed).map((r) => r.share)).toEqual([0.5, 0.5]);
  });

  it("has no share of a global batch for a parameter-server run, whose steps are each worker's own", () => {
    const ps = parseTrainConfig((name) => ({ world: '3', strategy: 'ps' })[name] ?? null);
    const s = replay([{ type: 'config', config: ps }, joined(1, 3), step(1, [rankStep(1)])]);
    expect(fleetRows(s).map((r) => r.share)).toEqual([null, null, null]);
  });

  it('starts over with a new group, and ignores a late word about the old one', () => {
    const before = replay([
      joined(0, 2),
      fleet(2, [
        [0, PHONE],
        [1, LAPTOP],
      ]),
    ]);
    const regrouped = replay([joined(0, 3)], before);
    expect(regrouped.fleet).toEqual([]);
    const late = replay(
      [
        fleet(2, [
          [0, PHONE],
          [1, LAPTOP],
        ]),
      ],
      regrouped,
    );
    expect(late.fleet).toEqual([]);
    const now = replay([fleet(3, [[0, PHONE]])], regrouped);
    expect(now.fleet.map((m) => m.rank)).toEqual([0]);
  });

  it('a spectator takes the published fleet, checked and cleaned', () => {
    const published = JSON.stringify({
      events: [
        {
          type: 'fleet',
          worldSize: 2,
          members: [
            { rank: 0, ...PHONE, browser: `Chrome\u202E ${'x'.repeat(400)}` },
            { rank: 1, ...LAPTOP },
          ],
        },
        { type: 'fleet', worldSize: 2, members: [{ rank: 5, ...PHONE }] },
        { type: 'fleet', worldSize: 'two', members: [] },
        { type: 'step', epoch: 0, step: 1, totalSteps: 2, elapsedSec: 1, ranks: [{ ...rankStep(0), samples: -1 }] },
        { type: 'step', epoch: 0, step: 1, totalSteps: 2, elapsedSec: 1, ranks: [{ ...rankStep(0), samples: 32 }] },
      ],
    });
    const events = parseEvents(published);
    expect(events.map((e) => e.type)).toEqual(['fleet', 'step']);
    const f = events[0] as Extract<TrainEvent, { type: 'fleet' }>;
    expect(Array.from(f.members[0]!.browser).length).toBeLessThanOrEqual(FLEET_TEXT_LIMITS.browser);
    expect(f.members[0]!.browser).not.toContain('\u202E');
    const s = replay(events);
    expect(fleetRows(s).map((r) => r.browser?.slice(0, 6))).toEqual(['Chrome', 'Firefo']);
  });
});
