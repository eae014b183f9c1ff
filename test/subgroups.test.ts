/**
 * Process subgroups (torch's `dist.new_group`): made by every rank in the same order, run over
 * the top-level group's links with their own sequence numbers, and failing all-or-nothing with
 * the top-level group. Real server for rendezvous and the store, in-memory peer links.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import {
  CollectiveMismatchError,
  DistTimeoutError,
  FramingError,
  GroupClosedError,
  PeerLostError,
  RankStalledError,
} from '../src/wire/errors.ts';
import { FrameKind, HEADER_BYTES, readHeader, writeHeader } from '../src/wire/framing.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { sleep } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

interface Extra {
  peerTimeoutMs?: number;
  stallTimeoutMs?: number;
  maxFrameBytes?: number;
  timeoutMs?: number;
}

async function groups(n: number, extra: Extra = {}): Promise<{ pgs: ProcessGroup[]; net: MemoryNetwork }> {
  const session = uniqueSession('sub');
  const net = new MemoryNetwork();
  const pgs = await Promise.all(
    Array.from({ length: n }, (_, rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: n,
        rank,
        timeoutMs: 5_000,
        linkFactory: net.factoryFor(rank),
        ...extra,
      }),
    ),
  );
  return { pgs, net };
}

/** Every rank makes every subgroup of `lists`, in order, as torch requires; [rank][list] is the subgroup or null. */
function newGroups(pgs: ProcessGroup[], lists: number[][]): Promise<Array<Array<ProcessGroup | null>>> {
  return Promise.all(
    pgs.map(async (pg) => {
      const out: Array<ProcessGroup | null> = [];
      for (const ranks of lists) out.push(await pg.newGroup(ranks));
      return out;
    }),
  );
}

/** The 4-rank layout of a pipeline-and-data-parallel job: two pipelines, two data-parallel groups. */
const PIPES = [
  [0, 1],
  [2, 3],
];
const DPS = [
  [0, 2],
  [1, 3],
];

async function fourRanks(extra: Extra = {}) {
  const { pgs, net } = await groups(4, extra);
  const subs = await newGroups(pgs, [...PIPES, ...DPS]);
  // Each rank's own pipeline and data-parallel group.
  const pipe = pgs.map((_, r) => subs[r]![r < 2 ? 0 : 1]!);
  const dp = pgs.map((_, r) => subs[r]![r % 2 === 0 ? 2 : 3]!);
  return { pgs, net, subs, pipe, dp };
}

/** Small integers: sums are exact in float32. Keyed by the top-level rank. */
const value = (rank: number, i: number) => ((i * 7 + rank * 13) % 17) - 8;
const input = (rank: number, len: number) => Float32Array.from({ length: len }, (_, i) => value(rank, i));
const sumOf = (ranks: readonly number[], len: number) =>
  Float32Array.from({ length: len }, (_, i) => ranks.reduce((a, r) => a + value(r, i), 0));

function destroy(pgs: ProcessGroup[]): void {
  for (const p of pgs) p.destroy();
}

async function settle<T>(p: Promise<T>): Promise<Error> {
  return p.then(
    () => new Error('it finished'),
    (e: unknown) => e as Error,
  );
}

describe('making subgroups', () => {
  it('every rank makes every subgroup in the same order; members get group ranks, non-members null', async () => {
    const { pgs, subs } = await fourRanks();
    expect(pgs[2]!.ranks).toEqual([0, 1, 2, 3]);
    expect(pgs[2]!.groupId).toBe(0);
    for (const [r, row] of subs.entries()) {
      for (const [i, ranks] of [...PIPES, ...DPS].entries()) {
        const sub = row[i];
        if (!ranks.includes(r)) {
          expect(sub).toBeNull();
          continue;
        }
        expect(sub).not.toBeNull();
        expect(sub!.groupId).toBe(i + 1);
        expect(sub!.ranks).toEqual(ranks);
        expect(sub!.worldSize).toBe(2);
        expect(sub!.rank).toBe(ranks.indexOf(r));
        expect(sub!.globalRank(sub!.rank)).toBe(r);
        expect(sub!.groupRank(r)).toBe(sub!.rank);
        expect(sub!.round).toBe(pgs[r]!.round);
      }
    }
    const dp13 = subs[3]![3]!;
    expect(dp13.globalRank(0)).toBe(1);
    expect(() => dp13.groupRank(2)).toThrow(
      errorOf(RangeError, /rank 2 is not a member of subgroup 4 \[1, 3\]; its top-level ranks are \[1, 3\]/),
    );
    expect(() => dp13.globalRank(2)).toThrow(RangeError);
    destroy(pgs);
  });

  it('subgroups started together (Promise.all) in the same order get the same ids everywhere', async () => {
    const { pgs } = await groups(3);
    const subs = await Promise.all(pgs.map((pg) => Promise.all([pg.newGroup([0, 1]), pg.newGroup([1, 2]), pg.newGroup([0, 2])])));
    expect(subs.map((row) => row.map((s) => s?.groupId ?? null))).toEqual([
      [1, null, 3],
      [1, 2, null],
      [null, 2, 3],
    ]);
    const outs = await Promise.all([subs[1]![1]!.allReduce(input(1, 6)), subs[2]![1]!.allReduce(input(2, 6))]);
    for (const out of outs) expect(out).toEqual(sumOf([1, 2], 6));
    destroy(pgs);
  });

  it('the rank list may come in any order: group ranks follow the sorted list', async () => {
    const { pgs } = await groups(3);
    const subs = await Promise.all(pgs.map((pg) => pg.newGroup([2, 0])));
    expect(subs[1]).toBeNull();
    expect(subs[0]!.ranks).toEqual([0, 2]);
    expect(subs[2]!.rank).toBe(1);
    const outs = await Promise.all([subs[0]!.allReduce(input(0, 5)), subs[2]!.allReduce(input(2, 5))]);
    for (const out of outs) expect(out).toEqual(sumOf([0, 2], 5));
    destroy(pgs);
  });

  it('refuses bad rank lists, saying what is wrong and what is allowed, and takes no id for them', async () => {
    const { pgs } = await groups(4);
    const pg = pgs[0]!;
    await expect(pg.newGroup([])).rejects.toThrow(
      errorOf(
        RangeError,
        /newGroup needs at least one rank; the list is empty \(allowed: ranks of the group, integers in 0\.\.3, each at most once\)/,
      ),
    );
    await expect(pg.newGroup([0, 2, 2])).rejects.toThrow(
      errorOf(RangeError, /newGroup got rank 2 more than once in \[0, 2, 2\] \(allowed: .*each at most once\)/),
    );
    await expect(pg.newGroup([0, 1.5])).rejects.toThrow(
      errorOf(RangeError, /newGroup got 1\.5 at index 1, not an integer \(allowed: ranks of the group, integers in 0\.\.3/),
    );
    await expect(pg.newGroup([0, '1' as unknown as number])).rejects.toThrow(
      errorOf(RangeError, /newGroup got "1" at index 1, not an integer/),
    );
    await expect(pg.newGroup([1, 4])).rejects.toThrow(errorOf(RangeError, /newGroup got rank 4 at index 1, outside 0\.\.3/));
    await expect(pg.newGroup([-1])).rejects.toThrow(RangeError);
    // None of those took an id: the first good one is subgroup 1 on every rank.
    const subs = await Promise.all(pgs.map((p) => p.newGroup([0, 1, 2, 3])));
    expect(subs.map((s) => s!.groupId)).toEqual([1, 1, 1, 1]);
    // Subgroups of subgroups are refused.
    await expect(subs[0]!.newGroup([0, 1])).rejects.toThrow(/call newGroup on the top-level group/);
    expect(pg.error).toBeUndefined();
    destroy(pgs);
  });

  it('a member that never makes the subgroup: the others time out naming what they waited for, and their groups fail', async () => {
    const { pgs } = await groups(3, { timeoutMs: 1_500 });
    const t0 = Date.now();
    // Rank 1 never calls newGroup; rank 2 is not a member and returns at once.
    const waiting = settle(pgs[0]!.newGroup([0, 1]));
    expect(await pgs[2]!.newGroup([0, 1])).toBeNull();
    const err = await waiting;
    expect(err).toBeInstanceOf(DistTimeoutError);
    expect(err.message).toBe(
      'timed out after 1500 ms waiting for all 2 members of subgroup 1 [0, 1] to call newGroup (1 did; every rank must call newGroup for every subgroup, in the same order)',
    );
    expect(Date.now() - t0).toBeLessThan(4_000);
    expect(pgs[0]!.error).toBe(err);
    destroy(pgs);
  });
});

describe('collectives in subgroups', () => {
  it('two disjoint subgroups run collectives at the same time', async () => {
    const { pgs, pipe } = await fourRanks({ maxFrameBytes: 256 });
    const outs = await Promise.all(pgs.map((_, r) => pipe[r]!.allReduce(input(r, 1001))));
    outs.forEach((out, r) => {
      expect(out).toEqual(sumOf(r < 2 ? [0, 1] : [2, 3], 1001));
    });
    destroy(pgs);
  });

  it('the top-level group and overlapping subgroups, started together on the same ranks, each get their own results', async () => {
    const { pgs, pipe, dp } = await fourRanks({ maxFrameBytes: 256 });
    const len = 1001;
    // Every rank starts everything before awaiting anything, in a different order on odd ranks.
    const started = pgs.map((pg, r) => {
      const p = pipe[r]!;
      const d = dp[r]!;
      const calls = {
        world: () => pg.allReduce(input(r, len)),
        pipeSum: () => p.allReduce(input(r, len)),
        dpBroadcast: () => d.broadcast(d.rank === 1 ? input(r, len) : new Float32Array(len), 1),
        dpGather: () => d.allGather(input(r, 3)),
        pipeMax: () => p.allReduce(input(r, 17), 'max'),
        dpMesh: () => d.meshAllReduce(input(r, 33)),
        pipeScatter: () => p.reduceScatter(input(r, 10)),
        world2: () => pg.allReduce(input(r, 7), 'min'),
        pipeBarrier: () => p.barrier().then(() => new Float32Array(0)),
      };
      // Within one group every rank must issue the same order; across groups it may differ:
      // odd ranks start the data-parallel group's calls first, then the pipeline's, then the world's.
      const names = Object.keys(calls) as Array<keyof typeof calls>;
      const group = (n: string) => (n.startsWith('world') ? 0 : n.startsWith('pipe') ? 1 : 2);
      const interleaved = r % 2 === 0 ? names : [...names].sort((a, b) => group(b) - group(a));
      return Object.fromEntries(interleaved.map((n) => [n, calls[n]()])) as Record<keyof typeof calls, Promise<Float32Array>>;
    });
    for (const [r, s] of started.entries()) {
      const pipeRanks = r < 2 ? [0, 1] : [2, 3];
      const dpRanks = r % 2 === 0 ? [0, 2] : [1, 3];
      expect(await s.world).toEqual(sumOf([0, 1, 2, 3], len));
      expect(await s.pipeSum).toEqual(sumOf(pipeRanks, len));
      expect(await s.dpBroadcast).toEqual(input(dpRanks[1]!, len));
      expect(await s.dpGather).toEqual(Float32Array.from([...input(dpRanks[0]!, 3), ...input(dpRanks[1]!, 3)]));
      expect(await s.pipeMax).toEqual(Float32Array.from({ length: 17 }, (_, i) => Math.max(...pipeRanks.map((q) => value(q, i)))));
      expect(await s.dpMesh).toEqual(sumOf(dpRanks, 33));
      const full = sumOf(pipeRanks, 10);
      const g = pipeRanks.indexOf(r);
      expect(await s.pipeScatter).toEqual(full.slice(g * 5, g * 5 + 5));
      expect(await s.world2).toEqual(Float32Array.from({ length: 7 }, (_, i) => Math.min(...[0, 1, 2, 3].map((q) => value(q, i)))));
      await s.pipeBarrier;
    }
    destroy(pgs);
  });

  it('opens no new links: subgroups use the top-level group’s', async () => {
    const { pgs, net, pipe, dp } = await fourRanks();
    // A full mesh in the top-level group opens every pair's link.
    await Promise.all(pgs.map((pg, r) => pg.meshAllReduce(input(r, 4))));
    const links = net.links.length;
    expect(links).toBe(12); // 6 pairs, two ends each
    await Promise.all(
      pgs.flatMap((_, r) => [
        pipe[r]!.allReduce(input(r, 100)),
        dp[r]!.meshAllReduce(input(r, 100)),
        dp[r]!.broadcast(new Float32Array(9), 0),
      ]),
    );
    const more = await newGroups(pgs, [[0, 1, 3]]);
    await Promise.all(more.filter((row) => row[0]).map((row) => row[0]!.allGather(Float32Array.of(1))));
    expect(net.links.length).toBe(links);
    // A subgroup reports only its members' links.
    expect(dp[1]!.linkStats().map((s) => s.peer)).toEqual([3]);
    destroy(pgs);
  });

  it('send and recv take group ranks; the top-level group’s messages and a subgroup’s between the same pair do not mix', async () => {
    const { pgs, dp } = await fourRanks();
    const sub1 = dp[1]!; // [1, 3]: top-level rank 1 is group rank 0
    const sub3 = dp[3]!; // top-level rank 3 is group rank 1
    const a = Float32Array.of(1, 2, 3);
    const b = Float32Array.of(4, 5, 6);
    const viaSub = new Float32Array(3);
    const viaWorld = new Float32Array(3);
    // Same pair, same length, sent in one order and received in the other.
    await Promise.all([sub1.send(a, 1), pgs[1]!.send(b, 3), pgs[3]!.recv(viaWorld, 1), sub3.recv(viaSub, 0)]);
    expect([...viaSub]).toEqual([1, 2, 3]);
    expect([...viaWorld]).toEqual([4, 5, 6]);
    // Top-level ranks are not group ranks.
    await expect(sub1.send(a, 3)).rejects.toThrow(
      errorOf(RangeError, /dst must be a rank of subgroup 4 \[1, 3\] \(group ranks, not top-level ranks\) in 0\.\.1, got 3/),
    );
    await expect(sub1.recv(a, 0)).rejects.toThrow(errorOf(RangeError, /src must be another rank/));
    destroy(pgs);
  });

  it('a subgroup of one returns its input; destroying a subgroup only detaches it', async () => {
    const { pgs, net } = await groups(2);
    const singles = await newGroups(pgs, [[0], [1]]);
    const solo = singles[1]![1]!;
    expect(solo.worldSize).toBe(1);
    expect([...(await solo.allReduce(Float32Array.of(3), 'avg'))]).toEqual([3]);
    await solo.barrier();
    const pair = await Promise.all(pgs.map((pg) => pg.newGroup([0, 1])));
    await Promise.all(pair.map((s, r) => s!.allReduce(input(r, 5))));
    const links = net.links.length;
    pair[0]!.destroy();
    await expect(pair[0]!.allReduce(new Float32Array(1))).rejects.toThrow(GroupClosedError);
    expect(pair[0]!.error?.message).toBe('subgroup 3 [0, 1] was destroyed');
    // A frame still arriving for it is dropped; the top-level group goes on over the same links.
    await pair[1]!.send(Float32Array.of(1), 0);
    const outs = await Promise.all(pgs.map((pg, r) => pg.allReduce(input(r, 5))));
    for (const out of outs) expect(out).toEqual(sumOf([0, 1], 5));
    expect(pgs[0]!.error).toBeUndefined();
    expect(net.links.length).toBe(links);
    expect(net.links.every((l) => l.state === 'open')).toBe(true);
    destroy(pgs);
  });
});

describe('failure in subgroups', () => {
  it('a lost rank fails the subgroups and the top-level group, naming its top-level rank', async () => {
    const { pgs, pipe, dp } = await fourRanks({ peerTimeoutMs: 5_000 });
    await Promise.all(pgs.map((_, r) => dp[r]!.allReduce(input(r, 4))));
    // Ranks 1 and 2 wait on subgroups with rank 3 in them (as group rank 1); rank 0 on one without it.
    const waits = [
      pipe[0]!.allReduce(new Float32Array(10)),
      dp[1]!.recv(new Float32Array(10), 1),
      pipe[2]!.allReduce(new Float32Array(10)),
    ].map(settle);
    // A scenario, not an order: the waits are all made, and rank 3 going at any time after them ends the same way.
    void sleep(100).then(() => pgs[3]!.destroy());
    const [at0, at1, at2] = await Promise.all(waits);
    for (const err of [at1, at2]) {
      expect(err).toBeInstanceOf(PeerLostError);
      expect((err as PeerLostError).rank).toBe(3);
    }
    // Rank 0's subgroup fails too, all-or-nothing, with the same reason as its top-level group.
    expect(at0).toBeInstanceOf(PeerLostError);
    for (const r of [0, 1, 2]) {
      expect((pgs[r]!.error as PeerLostError).rank).toBe(3);
      expect(pipe[r]!.error).toBe(pgs[r]!.error);
      expect(dp[r]!.error).toBe(pgs[r]!.error);
    }
    await expect(pgs[1]!.allReduce(new Float32Array(1))).rejects.toThrow(errorOf(PeerLostError, /lost rank 3/));
    destroy(pgs);
  });

  it('a silent peer in a subgroup is named by its top-level rank, and the message says which subgroup', async () => {
    const { pgs, dp } = await fourRanks({ peerTimeoutMs: 300 });
    const err = (await settle(dp[1]!.allReduce(new Float32Array(8)))) as PeerLostError;
    expect(err).toBeInstanceOf(PeerLostError);
    expect(err.rank).toBe(3);
    expect(err.message).toMatch(
      /^lost rank 3: sent nothing for 300 ms while this rank waited for allReduce\(sum\) of 8 elements #1 step 0 in subgroup 4 \[1, 3\]$/,
    );
    expect(pgs[1]!.error).toBe(err);
    destroy(pgs);
  });

  it('a stalled peer (no liveness frames) fails a subgroup collective within the stall bound', async () => {
    const { pgs, net, dp } = await fourRanks({ peerTimeoutMs: 20_000, stallTimeoutMs: 1_500 });
    await Promise.all(pgs.map((_, r) => dp[r]!.allReduce(input(r, 1))));
    net.end(3, 1)!.stall();
    const t0 = Date.now();
    const err = (await settle(dp[1]!.allReduce(Float32Array.of(1)))) as PeerLostError;
    expect(err).toBeInstanceOf(PeerLostError);
    expect(err.rank).toBe(3);
    expect(err.message).toMatch(
      /stalled: no sign of life for \d+ ms .* while this rank waited for allReduce\(sum\) of 1 elements #2 step 0 in subgroup 4 \[1, 3\]/,
    );
    expect(Date.now() - t0).toBeLessThan(5_000);
    destroy(pgs);
  });

  it('a peer alive but late in a subgroup is waited for past the stall bound: liveness frames count in every group', async () => {
    const { pgs, dp } = await fourRanks({ peerTimeoutMs: 20_000, stallTimeoutMs: 1_000 });
    await Promise.all(pgs.map((_, r) => dp[r]!.allReduce(input(r, 1))));
    const early = dp[0]!.allReduce(Float32Array.of(2));
    await sleep(2_500); // the behaviour under test: rank 2 is late past the stall bound, but alive
    const late = dp[2]!.allReduce(Float32Array.of(3));
    expect([...(await early)]).toEqual([5]);
    expect([...(await late)]).toEqual([5]);
    destroy(pgs);
  });

  it('a rank whose page stops running while it waits in a subgroup fails every group with RankStalledError, saying where it waited', async () => {
    const { pgs, pipe, dp } = await fourRanks({ peerTimeoutMs: 20_000, stallTimeoutMs: 1_000 });
    await Promise.all(pgs.map((_, r) => dp[r]!.allReduce(input(r, 1))));
    const waiting = settle(dp[1]!.allReduce(Float32Array.of(1)));
    const until = Date.now() + 1_600;
    while (Date.now() < until) {
      /* blocked, as a frozen tab */
    }
    const err = (await waiting) as RankStalledError;
    expect(err).toBeInstanceOf(RankStalledError);
    expect(err.rank).toBe(1);
    expect(err.during).toBe('waiting for allReduce(sum) of 1 elements #2 in subgroup 4 [1, 3]');
    expect(pgs[1]!.error).toBe(err);
    expect(pipe[1]!.error).toBe(err);
    destroy(pgs);
  });

  it('a mismatch in a subgroup fails the top-level group and the other subgroups of the rank', async () => {
    const { pgs, pipe, dp } = await fourRanks();
    const results = await Promise.all([pipe[0]!.allReduce(new Float32Array(4)), pipe[1]!.allReduce(new Float32Array(5))].map(settle));
    for (const err of results) {
      expect(err).toBeInstanceOf(CollectiveMismatchError);
      expect(err.message).toMatch(
        /collective #1 in subgroup 1 \[0, 1\] does not match: rank [01] issued allReduce\(sum\) of [45] elements, rank [01] issued/,
      );
    }
    for (const r of [0, 1]) {
      expect(pgs[r]!.error).toBeInstanceOf(CollectiveMismatchError);
      expect(dp[r]!.error).toBe(pgs[r]!.error);
      await expect(pgs[r]!.barrier()).rejects.toThrow(CollectiveMismatchError);
    }
    destroy(pgs);
  });

  it('a subgroup breaks with its top-level group, with the same error (abort, destroy)', async () => {
    const { pgs, pipe, dp } = await fourRanks();
    const pending = settle(pipe[0]!.allReduce(new Float32Array(3)));
    const reason = new GroupClosedError('round 1 ended: the server formed round 2');
    pgs[0]!.abort(reason);
    expect(await pending).toBe(reason);
    expect(dp[0]!.error).toBe(reason);
    await expect(dp[0]!.allGather(new Float32Array(1))).rejects.toBe(reason);
    pgs[2]!.destroy();
    expect(pipe[2]!.error?.message).toBe('the process group was destroyed');
    expect(dp[2]!.error).toBe(pgs[2]!.error);
    destroy(pgs);
  });

  it('a collective aborted on one member aborts it on the others through the subgroup’s notices', async () => {
    const { pgs, net, dp } = await fourRanks({ maxFrameBytes: 256, peerTimeoutMs: 5_000 });
    await Promise.all(pgs.map((_, r) => dp[r]!.allReduce(input(r, 4))));
    // A duplicated chunk from rank 1 to rank 3: rank 3 fails with a FramingError, and tells rank 1.
    let sent = 0;
    net.end(1, 3)!.intercept = (f) => (++sent === 2 ? [f, f] : [f]);
    const results = await Promise.all([dp[1]!.allReduce(new Float32Array(1000)), dp[3]!.allReduce(new Float32Array(1000))].map(settle));
    expect(results[1]).toBeInstanceOf(FramingError);
    expect(results[1]!.message).toMatch(/^duplicate chunk at offset \d+; expected offset \d+ \(seq 2\)$/);
    expect(results[0]).toBeInstanceOf(FramingError);
    expect(results[0]!.message).toMatch(/^rank 3 reported: duplicate chunk/);
    destroy(pgs);
  });
});

describe('hostile frames for groups', () => {
  /** A copy of `frame` claiming to be for group `group`. */
  const forGroup = (frame: Uint8Array, group: number) => {
    const out = frame.slice();
    writeHeader(out, { ...readHeader(frame), group });
    return out;
  };

  for (const [what, group, message] of [
    [
      'a group id this rank never created',
      77,
      /^bad frame from rank 0: frame for group 77, a group this rank never created \(seq 2\); refused, not buffered$/,
    ],
    [
      'a subgroup this rank is not a member of',
      2,
      /^bad frame from rank 0: frame for group 2, a subgroup this rank is not a member of \(seq 2\); refused, not buffered$/,
    ],
  ] as const) {
    it(`a frame for ${what} fails the groups at once with a FramingError naming the id`, async () => {
      const { pgs, net } = await groups(4, { peerTimeoutMs: 10_000 });
      await newGroups(pgs, [
        [0, 1],
        [2, 3],
      ]);
      await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(4))));
      let first = true;
      net.end(0, 1)!.intercept = (f) => {
        if (!first) return [f];
        first = false;
        return [forGroup(f, group)];
      };
      const t0 = Date.now();
      const results = await Promise.all(pgs.map((pg) => settle(pg.allReduce(new Float32Array(8)))));
      const err = results[1] as FramingError;
      expect(err).toBeInstanceOf(FramingError);
      expect(err).toMatchObject({ rank: 0, field: 'group' });
      expect(err.message).toMatch(message);
      expect(Date.now() - t0).toBeLessThan(3_000); // refused, not kept waiting for a receive
      expect(results[0]).toBeInstanceOf(FramingError); // told by rank 1's abort notice
      destroy(pgs);
    });
  }

  it('a frame for a subgroup from a rank that is not a member of it is refused, naming both', async () => {
    const { pgs, net } = await groups(3, { peerTimeoutMs: 10_000 });
    const subs = await newGroups(pgs, [[0, 1]]);
    await Promise.all(pgs.map((pg) => pg.meshAllReduce(new Float32Array(4))));
    net.end(2, 1)!.intercept = (f) => [forGroup(f, 1)];
    await pgs[2]!.send(Float32Array.of(1), 1);
    await vi.waitFor(() => expect(pgs[1]!.error).toBeDefined());
    const err = pgs[1]!.error as FramingError;
    expect(err).toBeInstanceOf(FramingError);
    expect(err).toMatchObject({ rank: 2, field: 'group' });
    expect(err.message).toBe(
      'bad frame from rank 2: frame for subgroup 1 [0, 1], which rank 2 is not a member of (seq 1); refused, not buffered',
    );
    expect(subs[1]![0]!.error).toBe(err);
    destroy(pgs);
  });

  it('a liveness frame that names a group is refused', async () => {
    const { pgs, net } = await groups(2, { stallTimeoutMs: 400 });
    await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(1))));
    net.end(0, 1)!.intercept = (f) => (f.length === HEADER_BYTES && readHeader(f).kind === FrameKind.alive ? [forGroup(f, 1)] : [f]);
    await vi.waitFor(() => expect(pgs[1]!.error).toBeDefined(), { timeout: 2_000 });
    expect(pgs[1]!.error!.message).toBe('bad frame from rank 0: a liveness frame is about the link and carries group 0, this one group 1');
    destroy(pgs);
  });
});
