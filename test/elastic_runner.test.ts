/**
 * runElastic in Node (TF.js cpu backend, in-memory links, the real server): a member lost
 * mid-run, a member joining mid-run, resuming from another session's checkpoint, and failures a
 * new round cannot fix. The samples each rank trained are checked from its own reported batches.
 * The same paths on real pages with WebRTC are in test/e2e/elastic.spec.ts and examples.spec.ts.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { samplesSeen } from '../launcher/samples_seen.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { runElastic, type ElasticRunResult, type StepContext } from '../src/parallel/ddp/runner.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { CollectiveMismatchError, PeerLostError, RendezvousClosedError, ReplicaDivergenceError } from '../src/wire/errors.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'ddp-runner-')) });
});
afterAll(async () => {
  await server.close();
});

const data = syntheticDataset({ length: 120, inputSize: 16, numClasses: 4, seed: 1 });

interface Member {
  events: ElasticEvent[];
  result: Promise<ElasticRunResult>;
}

/** One member of the session: a plain SGD step on its samples, plus whatever `extra` does first. */
function member(
  net: MemoryNetwork,
  id: number,
  session: string,
  opts: {
    min: number;
    max: number;
    steps?: number;
    checkpointEvery?: number;
    checkReplicasEvery?: number;
    resumeFrom?: string;
    stopVote?: 'any' | 'all';
    spectate?: boolean;
    shouldStop?: () => boolean;
    failedRoundGraceMs?: number;
    extra?: (ctx: StepContext) => Promise<void>;
    prefetch?: (indices: number[]) => void;
    voteWithGradients?: boolean;
    voteAfter?: (step: number) => boolean;
    onStep?: (ctx: { pg: ProcessGroup; step: number }) => Promise<void>;
  },
): Member {
  const events: ElasticEvent[] = [];
  const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 0 });
  const state = new TrainState({ model, optimizer: () => tf.train.sgd(0.1) });
  const result = runElastic({
    url: server.url,
    session,
    token: tokenFor(session),
    min: opts.min,
    max: opts.max,
    timeoutMs: 10_000,
    heartbeatIntervalMs: 200,
    linkFactory: net.factoryFor(id),
    state,
    datasetLength: data.length,
    batchSize: 4,
    steps: opts.steps,
    seed: 5,
    checkpointEvery: opts.checkpointEvery,
    checkReplicasEvery: opts.checkReplicasEvery,
    resumeFrom: opts.resumeFrom,
    stopVote: opts.stopVote,
    spectate: opts.spectate,
    shouldStop: opts.shouldStop,
    failedRoundGraceMs: opts.failedRoundGraceMs,
    ...(opts.prefetch ? { prefetch: opts.prefetch } : {}),
    voteWithGradients: opts.voteWithGradients,
    voteAfter: opts.voteAfter,
    ...(opts.onStep ? { onStep: opts.onStep } : {}),
    // Another session's checkpoints need that session's token.
    resumeFromToken: opts.resumeFrom === undefined ? undefined : tokenFor(opts.resumeFrom),
    onEvent: (e) => events.push(e),
    async step(ctx) {
      await opts.extra?.(ctx);
      const { x, y } = data.batch(ctx.indices);
      const xs = tf.tensor(x, [ctx.indices.length, 16]);
      const ys = tf.tensor1d(y, 'int32');
      const { loss } = await ctx.ddp.backward(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, 4));
      tf.dispose([xs, ys]);
      ctx.ddp.step(ctx.optimizer);
      return { loss };
    },
  });
  result.catch(() => {});
  return { events, result };
}

/**
 * A member that leaves for good during `step` (as a tab closing mid-step does: its vote for the
 * step before went out as the step began): its run fails, the others go on.
 */
class TabClosed extends Error {}
const leaveAt = (step: number) => async (ctx: StepContext) => {
  if (ctx.step !== step) return;
  await new Promise((r) => setTimeout(r, 250));
  throw new TabClosed(`rank ${ctx.pg.rank} closed at step ${step}`);
};

/** Every rank closes at once: close() waits for the others at a barrier. */
const closeAll = (runs: ElasticRunResult[]) => Promise.all(runs.map((r) => r.close()));

describe('runElastic', () => {
  it("stopVote 'all': one rank voting alone does not stop the run; the step every rank votes at does", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('vote');
    // Rank-to-be 1 wants to stop from the start (a member acting alone); the other learns of the stop at step 6.
    let seen = 0;
    const members = [
      member(net, 0, session, { min: 2, max: 2, steps: 30, stopVote: 'all', shouldStop: () => ++seen >= 6 }),
      member(net, 1, session, { min: 2, max: 2, steps: 30, stopVote: 'all', shouldStop: () => true }),
    ];
    const runs = await Promise.all(members.map((m) => m.result));
    expect(runs.map((r) => r.steps)).toEqual([6, 6]);
    expect(runs[0]!.stoppedBy).not.toBeNull();
    await closeAll(runs);
  });

  it("the vote goes out as each step begins and is read after it: no meeting of its own but the last step's (and those asked for), the same step events and the same weights as voting apart", async () => {
    const runWith = async (voteWithGradients: boolean, voteAfter?: (step: number) => boolean) => {
      const net = new MemoryNetwork();
      const session = uniqueSession('carry');
      // All-gathers each rank's groups issue from its first step on (recovery's, at the round's start, come before).
      const gathers = [0, 0, 0];
      /** Votes through the server (gatherRows), per rank. */
      const votes = [0, 0, 0];
      const counted = new Set<ProcessGroup>();
      const count = (id: number) => async (ctx: StepContext) => {
        if (counted.has(ctx.pg)) return;
        counted.add(ctx.pg);
        const allGather = ctx.pg.allGather.bind(ctx.pg);
        ctx.pg.allGather = (...args: Parameters<ProcessGroup['allGather']>) => {
          gathers[id]!++;
          return allGather(...args);
        };
        const gatherRows = ctx.pg.gatherRows.bind(ctx.pg);
        ctx.pg.gatherRows = (...args: Parameters<ProcessGroup['gatherRows']>) => {
          votes[id]!++;
          return gatherRows(...args);
        };
      };
      const members = [0, 1, 2].map((id) =>
        member(net, id, session, { min: 3, max: 3, steps: 10, voteWithGradients, voteAfter, extra: count(id) }),
      );
      const runs = await Promise.all(members.map((m) => m.result));
      const steps = members.map((m) => m.events.flatMap((e) => (e.type === 'step' ? [{ step: e.step, metrics: e.metrics }] : [])));
      await closeAll(runs);
      return { gathers, votes, steps, hashes: runs.map((r) => r.weightHash), stepCounts: runs.map((r) => r.steps) };
    };
    const apart = await runWith(false);
    const riding = await runWith(true);
    // Votes go through the server, never over the peer links (where any member could write any row).
    expect([apart.gathers, riding.gathers]).toEqual([
      [0, 0, 0],
      [0, 0, 0],
    ]);
    // The first step's vote was started before the counter was in place.
    expect(apart.votes).toEqual([10, 10, 10]);
    // Steps 1-9's votes went out as steps 2-10 began (read after them); the run's last step voted on its own.
    expect(riding.votes).toEqual([10, 10, 10]);
    expect(riding.stepCounts).toEqual([10, 10, 10]);
    for (const r of [0, 1, 2]) {
      expect(riding.steps[r]!.map((s) => s.step)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
      // Every rank's loss at every step, as the separate votes gave them.
      expect(riding.steps[r]).toEqual(apart.steps[r]);
    }
    expect(new Set([...riding.hashes, ...apart.hashes]).size).toBe(1);
    // voteAfter: those steps vote on their own, so their onStep runs before the next step.
    const asked = await runWith(true, (step) => step % 4 === 0);
    expect(asked.votes).toEqual([12, 12, 12]);
    expect(asked.steps[0]).toEqual(apart.steps[0]);
  });

  it("prefetch: as each step starts, the rank hears its samples of the next step (a streamed dataset's read-ahead), never past the run's last step", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('prefetch');
    const heard: number[][][] = [[], []];
    const members = [0, 1].map((id) => member(net, id, session, { min: 2, max: 2, steps: 7, prefetch: (next) => heard[id]!.push(next) }));
    const runs = await Promise.all(members.map((m) => m.result));
    for (const [id, m] of members.entries()) {
      const batches = m.events.filter((e): e is Extract<ElasticEvent, { type: 'batch' }> => e.type === 'batch').map((e) => e.indices);
      expect(batches).toHaveLength(7);
      // Step k's prefetch is step k + 1's batch; the last step prefetches nothing.
      expect(heard[id]).toEqual(batches.slice(1));
    }
    await closeAll(runs);
  });

  it('a member lost mid-run: the rest recover from a surviving replica, re-shard, and train every sample once', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('lost');
    const members = [0, 1, 2].map((id) => member(net, id, session, { min: 2, max: 3, extra: id === 1 ? leaveAt(4) : undefined }));
    const outcomes = await Promise.allSettled(members.map((m) => m.result));
    const lost = outcomes.filter((o) => o.status === 'rejected');
    expect(lost).toHaveLength(1);
    expect((lost[0] as PromiseRejectedResult).reason).toBeInstanceOf(TabClosed);
    const done = outcomes.filter((o): o is PromiseFulfilledResult<ElasticRunResult> => o.status === 'fulfilled').map((o) => o.value);
    expect(done.map((r) => [r.rank, r.worldSize]).sort()).toEqual([
      [0, 2],
      [1, 2],
    ]);
    expect(new Set(done.map((r) => r.weightHash)).size).toBe(1);
    for (const r of done) {
      expect(r.generations).toBe(2);
      expect(r.stepsRedone).toBe(1); // step 4 was in flight on every rank
      // 3 steps of 3 x 4, then the remaining 84 samples over 2 ranks: 11 steps.
      expect(r.steps).toBe(3 + 11);
      expect(r.resumes).toEqual(['resumed at step 3: every rank held the replica of rank 0, nothing sent; step 4 is trained again']);
    }
    expect(samplesSeen(members.flatMap((m) => m.events))).toEqual([{ samples: 120, exactlyOnce: true, complete: true }]);
    // Every step has its step event (and onStep) once on each survivor, step 3 too: its vote had
    // come back when step 4 failed (before, the step before every fault had none).
    for (const m of members.filter((_, i) => outcomes[i]!.status === 'fulfilled'))
      expect(m.events.flatMap((e) => (e.type === 'step' ? [e.step] : []))).toEqual(Array.from({ length: 14 }, (_, i) => i + 1));
    // Each round event says where the rank's way into it went: no rendezvous before the first;
    // after the loss, times that are never negative, whichever came first (the round or the failure).
    for (const m of members) {
      const phases = m.events.flatMap((e) => (e.type === 'round' ? [e.phasesMs] : []));
      expect(phases[0]?.rendezvous).toBeNull();
      for (const p of phases) expect(p!.state).toBeGreaterThanOrEqual(0);
      for (const p of phases.slice(1)) expect(p!.rendezvous).toBeGreaterThanOrEqual(0);
    }
    await closeAll(done);
  });

  it('a link between two live ranks breaks: nobody left, so the ranks ask the server for a new round of the same members, and finish', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('link-broke');
    let broken = false;
    // Both tabs stay connected to the server: only their WebRTC link closes (as a data channel can).
    const breakLinkAt = (id: number) => async (ctx: StepContext) => {
      if (ctx.step !== 4 || broken) return;
      broken = true;
      net.end(id, 1 - ctx.pg.rank)!.close('its data channel closed');
    };
    const members = [0, 1].map((id) =>
      member(net, id, session, { min: 2, max: 2, steps: 10, failedRoundGraceMs: 300, extra: breakLinkAt(id) }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    expect(runs.map((r) => r.steps)).toEqual([10, 10]);
    expect(runs.map((r) => r.generations)).toEqual([2, 2]);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    for (const m of members) {
      expect(m.events.filter((e) => e.type === 'failure').map((e) => (e as { recoverable: boolean }).recoverable)).toEqual([true]);
    }
    await closeAll(runs);
  });

  it("a round that fails between a vote and the replica check it called for (on one rank before the check, on the other in it): the next round's ranks agree on their collectives", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('check-split');
    let broken = false;
    // checkReplicasEvery 2: step 2's vote is due a check. After that vote rank 1's link to rank 0
    // closes and rank 1's round fails in onStep, before the check; rank 0's fails in the check.
    const failBeforeCheck =
      (id: number) =>
      async ({ pg, step }: { pg: ProcessGroup; step: number }) => {
        if (step !== 2 || pg.rank !== 1 || broken) return;
        broken = true;
        net.end(id, 0)!.close('its data channel closed');
        await pg.allReduce(new Float32Array(1));
      };
    const members = [0, 1].map((id) =>
      member(net, id, session, { min: 2, max: 2, steps: 8, checkReplicasEvery: 2, failedRoundGraceMs: 300, onStep: failBeforeCheck(id) }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    expect(broken).toBe(true);
    expect(runs.map((r) => r.steps)).toEqual([8, 8]);
    expect(runs.map((r) => r.generations)).toEqual([2, 2]);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    for (const m of members)
      expect(m.events.filter((e) => e.type === 'failure').map((e) => (e as { step: number; recoverable: boolean }).recoverable)).toEqual([
        true,
      ]);
    await closeAll(runs);
  });

  it("a member cannot write the other ranks' rows of the vote: forged stop wishes in every row (stopVote 'all') stop nothing", async () => {
    // Votes rode on the gradients' sum all-reduce, where any member could add into any rank's
    // row: here rank 2 carries a stop in every row with its gradients once, which stopped the run
    // at step 2 "by rank 0". The rows now go through the server, each placed at its sender's rank.
    const net = new MemoryNetwork();
    const session = uniqueSession('forged-vote');
    let forged = false;
    const forge = async (ctx: StepContext) => {
      if (ctx.step !== 2 || ctx.pg.rank !== 2 || forged) return;
      forged = true;
      // [stop, join, work, loss] per rank, as the carried vote laid them out.
      ctx.ddp.carry(new Float32Array([1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]));
    };
    const members = [0, 1, 2].map((id) => member(net, id, session, { min: 3, max: 3, steps: 8, stopVote: 'all', extra: forge }));
    const outcomes = await Promise.allSettled(members.map((m) => m.result));
    expect(forged).toBe(true);
    // The forged values now ride on nothing anyone reads: the extra values fail the step's
    // all-reduce (its sizes differ), never stop the run in another rank's name.
    for (const o of outcomes) {
      if (o.status === 'fulfilled') expect([o.value.stoppedBy, o.value.steps]).toEqual([null, 8]);
      else expect((o.reason as Error).message).not.toMatch(/stopped/);
    }
    expect(members.flatMap((m) => m.events).filter((e) => e.type === 'end' && e.stoppedBy !== null)).toEqual([]);
    await closeAll(outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : [])));
  });

  it('a rank whose last round fails as the others finish the run learns at once that the run ended, with its rank in the error', async () => {
    // A collective can complete on some ranks and fail on another (a kill during the last step's
    // all-reduce): that rank waits for a next round that never forms. Here rank 2's round fails
    // after the last step's vote; the others end the run and close the rendezvous.
    const net = new MemoryNetwork();
    const session = uniqueSession('last-step');
    const failLast = async ({ pg, step }: { pg: ProcessGroup; step: number }) => {
      if (step === 6 && pg.rank === 2) throw new PeerLostError(0, 'its link closed during the last step');
    };
    const members = [0, 1, 2].map((id) => member(net, id, session, { min: 2, max: 3, steps: 6, onStep: failLast }));
    const outcomes = await Promise.allSettled(members.map((m) => m.result));
    // The server's word, 'rendezvous-closed', is what fails it: without it, it waits out its
    // timeout (10 s) and fails with DistTimeoutError instead.
    const failed = outcomes.filter((o): o is PromiseRejectedResult => o.status === 'rejected');
    expect(failed).toHaveLength(1);
    const err = failed[0]!.reason as RendezvousClosedError;
    expect(err).toBeInstanceOf(RendezvousClosedError);
    expect(err.rank).toBe(2);
    expect(err.message).toMatch(/ended without this rank: its last round \(\d+\) failed here, on rank 2/);
    const runs = outcomes.filter((o): o is PromiseFulfilledResult<ElasticRunResult> => o.status === 'fulfilled').map((o) => o.value);
    expect(runs.map((r) => r.steps)).toEqual([6, 6]);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    await closeAll(runs);
  });

  it('a member joining mid-run gets the state at a step boundary and trains the rest of the epoch', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('join');
    let joiner: Member | undefined;
    const first = [0, 1].map((id) =>
      member(net, id, session, {
        min: 2,
        max: 3,
        extra: async (ctx) => {
          if (ctx.step === 3 && ctx.pg.rank === 0 && !joiner) joiner = member(net, 2, session, { min: 2, max: 3 });
        },
      }),
    );
    const done = await Promise.all(first.map((m) => m.result));
    const late = await joiner!.result;
    const all = [...done, late];
    expect(all.map((r) => r.worldSize)).toEqual([3, 3, 3]);
    expect(new Set(all.map((r) => r.weightHash)).size).toBe(1);
    expect(all.every((r) => r.stepsRedone === 0 && r.generations === 2)).toBe(true);
    const events = [...first, joiner!].flatMap((m) => m.events);
    expect(events.some((e) => e.type === 'regroup')).toBe(true);
    expect(samplesSeen(events)).toEqual([{ samples: 120, exactlyOnce: true, complete: true }]);
    await closeAll(all);
  });

  it("resumes from another session's checkpoint when nobody has live state", async () => {
    const net = new MemoryNetwork();
    const source = uniqueSession('ckpt');
    const before = await Promise.all([0, 1].map((id) => member(net, id, source, { min: 2, max: 2, steps: 6, checkpointEvery: 3 }).result));
    await closeAll(before);
    const session = uniqueSession('resumed');
    const members = [0, 1].map((id) => member(net, id + 10, session, { min: 2, max: 2, steps: 9, resumeFrom: source }));
    const after = await Promise.all(members.map((m) => m.result));
    for (const r of after) {
      expect(r.steps).toBe(9);
      expect(r.resumes[0]).toMatch(new RegExp(`^resumed at step 6 from checkpoint .*-step-00000006 of session "${source}"$`));
    }
    const round = members[0]!.events.find((e) => e.type === 'round');
    expect(round).toMatchObject({ source: 'checkpoint', step: 6, position: 6 * 8 });
    expect(new Set(after.map((r) => r.weightHash)).size).toBe(1);
    await closeAll(after);
  });

  it('the end of a run closes the rendezvous: a tab waiting for a rank, or arriving later, fails at once instead of waiting out its timeout', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('closed');
    let spectator: Member | undefined;
    // At step 3 a third tab arrives at the full group and waits beyond it; the run goes on once the ranks have heard of it.
    const extra = async (ctx: StepContext) => {
      if (ctx.step !== 3 || ctx.pg.rank !== 0) return;
      spectator = member(net, 2, session, { min: 2, max: 2, spectate: true });
      await waitFor('rank 0 to hear of the spectator', () => members[0]!.events.some((e) => e.type === 'waiting' && e.members === 3));
    };
    const members = [0, 1].map((id) => member(net, id, session, { min: 2, max: 2, steps: 6, extra }));
    const runs = await Promise.all(members.map((m) => m.result));
    expect(runs.map((r) => r.steps)).toEqual([6, 6]);
    const ended = Date.now();
    const waited = (await spectator!.result.catch((e: unknown) => e)) as RendezvousClosedError;
    expect(waited).toBeInstanceOf(RendezvousClosedError);
    expect(waited.message).toContain(`the run of session "${session}" has ended`);
    // Arriving after the end, while the ranks are still connected, and once they have left.
    const late = (await member(net, 3, session, { min: 2, max: 2 }).result.catch((e: unknown) => e)) as RendezvousClosedError;
    await closeAll(runs);
    const later = (await member(net, 4, session, { min: 2, max: 2 }).result.catch((e: unknown) => e)) as RendezvousClosedError;
    for (const err of [late, later]) {
      expect(err).toBeInstanceOf(RendezvousClosedError);
      expect(err.round).toBe(waited.round);
    }
    // The members' rendezvous timeout is 10 s: none of them waited it out.
    expect(Date.now() - ended).toBeLessThan(5_000);
  });

  it('ranks that issue different collectives end the run on every rank: a new round would fail the same way', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('mismatch');
    const extra = async (ctx: StepContext) => {
      if (ctx.step === 2 && ctx.pg.rank === 1) await ctx.pg.allReduce(new Float32Array(3));
    };
    const members = [0, 1].map((id) => member(net, id, session, { min: 2, max: 2, extra }));
    const outcomes = await Promise.allSettled(members.map((m) => m.result));
    for (const [i, o] of outcomes.entries()) {
      expect(o.status).toBe('rejected');
      expect((o as PromiseRejectedResult).reason).toBeInstanceOf(CollectiveMismatchError);
      const failure = members[i]!.events.find((e) => e.type === 'failure');
      expect(failure).toMatchObject({ recoverable: false, step: 1, inFlight: 2 });
    }
  });

  it('checkReplicasEvery: a rank whose weights went astray ends the run on every rank, named, before the next step', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('diverged');
    // Rank 1 nudges one weight before step 3's update: from then on its replica differs.
    const extra = async (ctx: StepContext) => {
      if (ctx.step !== 3 || ctx.pg.rank !== 1) return;
      const v = ctx.ddp.model.trainableWeights[0]!.read() as tf.Variable;
      const nudged = tf.tidy(() => v.add(1e-3));
      v.assign(nudged);
      nudged.dispose();
    };
    const members = [0, 1].map((id) => member(net, id, session, { min: 2, max: 2, checkReplicasEvery: 2, extra }));
    const outcomes = await Promise.allSettled(members.map((m) => m.result));
    for (const [i, o] of outcomes.entries()) {
      const err = (o as PromiseRejectedResult).reason as ReplicaDivergenceError;
      expect(err).toBeInstanceOf(ReplicaDivergenceError);
      expect(err.ranks).toEqual([1]);
      // Checked at steps 2 (agreeing) and 4 (not): step 5 never started.
      const steps = members[i]!.events.filter((e) => e.type === 'step').map((e) => (e as { step: number }).step);
      expect(steps).toEqual([1, 2, 3, 4]);
      expect(members[i]!.events.find((e) => e.type === 'failure')).toMatchObject({ recoverable: false, step: 4 });
    }
  });
});
