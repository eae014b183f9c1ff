/**
 * A link's network path: the selected ICE candidate pair read out of `getStats()` entries (the
 * fixtures are Chromium 156's own output, trimmed), the rates between readings, and the process
 * group's `linkDetails()` over real groups (in-memory links, which have no path, and links whose
 * stats answer late or never). The same reading over real WebRTC is checked end to end: 'host'
 * on loopback (test/e2e/collectives.spec.ts), 'relay' through coturn (test/e2e/turn.spec.ts).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { GroupLinks, nextPathReading, type LinkPath } from '../src/transport/group_links.ts';
import { selectedPath } from '../src/transport/link_stats.ts';
import type { PathSample } from '../src/transport/peer_link.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';

/** What Chromium reported for a loopback data channel: the selected pair changed after the first pair carried the bytes. */
function chromiumStats(localType = 'host', remoteType = 'host'): unknown[] {
  return [
    {
      id: 'CPold',
      timestamp: 1795316465516.387,
      type: 'candidate-pair',
      bytesReceived: 4831,
      bytesSent: 107181,
      currentRoundTripTime: 0.039,
      localCandidateId: 'Iold',
      nominated: true,
      remoteCandidateId: 'Rold',
      state: 'succeeded',
      transportId: 'T01',
    },
    {
      id: 'CPsel',
      timestamp: 1795316465516.387,
      type: 'candidate-pair',
      bytesReceived: 0,
      bytesSent: 0,
      currentRoundTripTime: 0.001,
      localCandidateId: 'Isel',
      nominated: true,
      remoteCandidateId: 'Rsel',
      state: 'succeeded',
      transportId: 'T01',
    },
    { id: 'Iold', type: 'local-candidate', address: '', candidateType: 'host', port: 56447, protocol: 'udp', transportId: 'T01' },
    { id: 'Rold', type: 'remote-candidate', address: '', candidateType: 'host', port: 48352, protocol: 'udp', transportId: 'T01' },
    {
      id: 'Isel',
      type: 'local-candidate',
      address: '',
      candidateType: localType,
      port: 48324,
      protocol: 'udp',
      relayProtocol: 'udp',
      transportId: 'T01',
    },
    { id: 'Rsel', type: 'remote-candidate', address: '', candidateType: remoteType, port: 42928, protocol: 'udp', transportId: 'T01' },
    {
      id: 'T01',
      timestamp: 1795316465516.387,
      type: 'transport',
      bytesReceived: 4831,
      bytesSent: 107181,
      dtlsState: 'connected',
      iceState: 'connected',
      selectedCandidatePairId: 'CPsel',
    },
  ];
}

describe('selectedPath', () => {
  it("reads Chromium's report: the transport's selected pair, its candidates' types, its RTT, the transport's counters", () => {
    expect(selectedPath(chromiumStats())).toEqual({
      local: 'host',
      remote: 'host',
      protocol: 'udp',
      rttMs: 1,
      bytesSent: 107181,
      bytesReceived: 4831,
      at: 1795316465516.387,
    });
    expect(selectedPath(chromiumStats('relay', 'relay'))).toMatchObject({ local: 'relay', remote: 'relay' });
    expect(selectedPath(chromiumStats('srflx', 'prflx'))).toMatchObject({ local: 'srflx', remote: 'prflx' });
  });

  it("takes a pair marked 'selected' (Firefox) or else the nominated, succeeded one that carried the most", () => {
    const firefox = chromiumStats().filter((s) => (s as { type: string }).type !== 'transport');
    (firefox[0] as Record<string, unknown>).selected = true;
    expect(selectedPath(firefox)).toMatchObject({ local: 'host', rttMs: 39, bytesSent: 107181 });
    delete (firefox[0] as Record<string, unknown>).selected;
    expect(selectedPath(firefox)).toMatchObject({ rttMs: 39, bytesSent: 107181 });
  });

  it('says nothing before a pair is selected, and nothing it cannot vouch for', () => {
    expect(selectedPath([])).toBeUndefined();
    expect(
      selectedPath([
        { id: 'T', type: 'transport', selectedCandidatePairId: 'missing' },
        { id: 'P', type: 'candidate-pair', state: 'in-progress', nominated: false },
      ]),
    ).toBeUndefined();
    const odd = chromiumStats('bogus', 'host');
    const pair = odd[1] as Record<string, unknown>;
    pair.currentRoundTripTime = -3;
    pair.timestamp = 'soon';
    (odd[4] as Record<string, unknown>).protocol = 'carrier-pigeon';
    (odd[6] as Record<string, unknown>).bytesSent = Number.NaN;
    pair.bytesSent = 12;
    const path = selectedPath([null, 'x', 7, ...odd], 1234);
    expect(path).toEqual({ local: null, remote: 'host', protocol: null, rttMs: null, bytesSent: 12, bytesReceived: 0, at: 1234 });
  });

  it('reads a bounded number of entries', () => {
    let read = 0;
    function* endless(): Generator<unknown> {
      for (;;) {
        read++;
        yield { id: `x${read}`, type: 'codec' };
      }
    }
    expect(selectedPath(endless())).toBeUndefined();
    expect(read).toBeLessThanOrEqual(2_001);
  });
});

describe('nextPathReading', () => {
  const sample = (at: number, sent: number, received: number): PathSample => ({
    local: 'relay',
    remote: 'relay',
    protocol: 'udp',
    rttMs: 2,
    bytesSent: sent,
    bytesReceived: received,
    at,
  });

  it('gives bytes per second between readings, none on the first', () => {
    const first = nextPathReading(undefined, sample(1_000, 0, 0));
    expect(first.path).toEqual({
      local: 'relay',
      remote: 'relay',
      protocol: 'udp',
      rttMs: 2,
      sentBytesPerSec: null,
      receivedBytesPerSec: null,
    });
    const second = nextPathReading(first, sample(3_000, 4_000_000, 1_000_000));
    expect(second.path).toMatchObject({ sentBytesPerSec: 2_000_000, receivedBytesPerSec: 500_000 });
  });

  it('keeps the rates and the base of a reading that comes too soon, and gives no rate for counters that went back', () => {
    const a = nextPathReading(nextPathReading(undefined, sample(0, 0, 0)), sample(2_000, 2_000, 2_000));
    const soon = nextPathReading(a, sample(2_100, 9_999_999, 9_999_999));
    expect(soon.sample).toBe(a.sample);
    expect(soon.path).toMatchObject({ sentBytesPerSec: 1_000, receivedBytesPerSec: 1_000 });
    const reset = nextPathReading(a, sample(4_000, 10, 4_000));
    expect(reset.path).toMatchObject({ sentBytesPerSec: null, receivedBytesPerSec: 1_000 });
  });
});

describe('linkDetails', () => {
  let server: RunningServer;
  beforeAll(async () => {
    server = await withServer();
  });
  afterAll(async () => {
    await server.close();
  });

  it('over in-memory links: the counters, and no path (they have none)', async () => {
    const session = uniqueSession('path');
    const net = new MemoryNetwork();
    const pgs = await Promise.all(
      [0, 1].map((rank) =>
        initProcessGroup({
          url: server.url,
          session,
          token: tokenFor(session),
          worldSize: 2,
          rank,
          timeoutMs: 5_000,
          linkFactory: net.factoryFor(rank),
        }),
      ),
    );
    try {
      await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(1000))));
      const [details] = await Promise.all([pgs[0]!.linkDetails()]);
      expect(details).toHaveLength(1);
      expect(details[0]).toMatchObject({ peer: 1, state: 'open', path: null });
      expect(details[0]!.bytesSent).toBeGreaterThanOrEqual(4000);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('a link whose stats answer late or fail gets no path, within the bound; the others theirs, with rates from the second reading', async () => {
    const net = new MemoryNetwork();
    let t = 0;
    // Peer 1 answers; peer 2 never does; peer 3's stats fail.
    const behaviour: Record<number, () => Promise<PathSample | undefined>> = {
      1: async () => {
        t += 1000;
        return { local: 'host', remote: 'host', protocol: 'udp', rttMs: 0.4, bytesSent: t * 10, bytesReceived: 0, at: t };
      },
      2: () => new Promise(() => {}),
      3: () => Promise.reject(new Error('stats unavailable')),
    };
    const make = (rank: number) => {
      const factory = net.factoryFor(rank);
      return new GroupLinks({
        rank,
        groupKey: 'g',
        factory: (o) => {
          const pending = factory(o);
          if (rank === 0) Object.assign(pending.link, { path: behaviour[o.peer] });
          return pending;
        },
        sendSignal: async () => {},
        iceServers: [],
        highWaterMark: 1 << 20,
        windowBytes: 0,
        stallTimeoutMs: 5_000,
        linkTimeoutMs: 5_000,
        onMessage: () => {},
        onState: () => {},
        onLost: () => {},
      });
    };
    const zero = make(0);
    const others = [1, 2, 3].map(make);
    await Promise.all([1, 2, 3].map((p) => Promise.all([zero.get(p), others[p - 1]!.get(0)])));
    const t0 = Date.now();
    const first = await zero.details(300);
    expect(Date.now() - t0).toBeLessThan(2_000);
    const byPeer = (ds: Array<{ peer: number; path: LinkPath | null }>) => Object.fromEntries(ds.map((d) => [d.peer, d.path]));
    expect(byPeer(first)).toEqual({
      1: { local: 'host', remote: 'host', protocol: 'udp', rttMs: 0.4, sentBytesPerSec: null, receivedBytesPerSec: null },
      2: null,
      3: null,
    });
    const second = byPeer(await zero.details(300));
    expect(second[1]).toMatchObject({ sentBytesPerSec: 10_000, receivedBytesPerSec: 0 });
    zero.closeAll(new Error('done'));
    for (const o of others) o.closeAll(new Error('done'));
  });
});
