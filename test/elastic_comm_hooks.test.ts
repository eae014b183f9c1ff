/**
 * DDP communication hooks in elastic training, in Node (TF.js cpu backend, in-memory links, the
 * real server): runElastic with fp16 compression and PowerSGD keeps replicas bit-identical every
 * step; the hook's state survives a checkpoint and reaches a joiner; post-local SGD with periodic
 * model averaging makes the replicas identical exactly at the averaging steps, and the replica
 * check waits for them. Also the hook state's place in a checkpoint's optimizer section.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { loadCheckpoint } from '../src/checkpoint/checkpoint.ts';
import { CheckpointCorruptError } from '../src/checkpoint/checkpoint_format.ts';
import { fp16CompressHook } from '../src/parallel/comm_hooks/default_hooks.ts';
import { postLocalSGD } from '../src/parallel/comm_hooks/local_sgd.ts';
import { powerSGD, type PowerSGDHook } from '../src/parallel/comm_hooks/powersgd.ts';
import type { CommHook, CommHookState } from '../src/parallel/comm_hooks/types.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { appendCommHookState, splitCommHookState } from '../src/elastic/hook_state.ts';
import {
  runElastic,
  type ElasticRunOptions,
  type ElasticRunResult,
  type RoundContext,
  type StepContext,
} from '../src/parallel/ddp/runner.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { optimizerState, TrainState } from '../src/checkpoint/state_dict.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'ddp-hooks-')) });
});
afterAll(async () => {
  await server.close();
});

const data = syntheticDataset({ length: 120, inputSize: 16, numClasses: 4, seed: 1 });

interface Member {
  events: ElasticEvent[];
  result: Promise<ElasticRunResult>;
  /** The hook `commHook` made on this member (once). */
  hooks: CommHook[];
}

type MemberOptions = Pick<
  ElasticRunOptions,
  'min' | 'max' | 'steps' | 'checkpointEvery' | 'checkReplicasEvery' | 'resumeFrom' | 'commHook' | 'modelAverager'
> & {
  extra?: (ctx: StepContext) => Promise<void>;
  onRound?: (ctx: RoundContext) => void | Promise<void>;
  onStep?: (ctx: RoundContext) => void | Promise<void>;
  onEpochEnd?: (ctx: RoundContext) => void | Promise<void>;
};

/** One member of the session: a plain SGD step on its samples. */
function member(net: MemoryNetwork, id: number, session: string, opts: MemberOptions): Member {
  const events: ElasticEvent[] = [];
  const hooks: CommHook[] = [];
  const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 0 });
  const state = new TrainState({ model, optimizer: () => tf.train.sgd(0.1) });
  const make = opts.commHook;
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
    resumeFromToken: opts.resumeFrom == null ? undefined : tokenFor(opts.resumeFrom),
    commHook:
      make === undefined
        ? undefined
        : () => {
            const hook = make();
            hooks.push(hook);
            return hook;
          },
    modelAverager: opts.modelAverager,
    onRound: opts.onRound,
    onStep: opts.onStep,
    onEpochEnd: opts.onEpochEnd,
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
  return { events, result, hooks };
}

const closeAll = (runs: ElasticRunResult[]) => Promise.all(runs.map((r) => r.close()));
const hex = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
/** A hook state with its tensors as hex, for bit-exact comparisons. */
const bits = (s: CommHookState | null) =>
  s && { name: s.name, meta: s.meta, tensors: Object.fromEntries(Object.entries(s.tensors).map(([k, v]) => [k, hex(v)])) };
/** Only the tensors every rank shares (PowerSGD's Q's). */
const shared = (s: CommHookState | null) => {
  const b = bits(s)!;
  return { ...b, tensors: Object.fromEntries(Object.entries(b.tensors).filter(([k]) => k.startsWith('q:'))) };
};
const psgd = () => powerSGD({ matrixApproximationRank: 1, startIter: 2 });
const losses = (m: Member) =>
  m.events.flatMap((e) => (e.type === 'step' ? [e.metrics.reduce((a, x) => a + (x.loss as number), 0) / e.metrics.length] : []));
const mean = (a: number[]) => a.reduce((x, y) => x + y, 0) / a.length;

describe('runElastic with communication hooks', () => {
  it('fp16CompressHook: replicas stay bit-identical every step, at about half the bytes', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('fp16');
    const members = [0, 1].map((id) =>
      member(net, id, session, { min: 2, max: 2, steps: 8, checkReplicasEvery: 1, commHook: fp16CompressHook }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    expect(runs.map((r) => r.steps)).toEqual([8, 8]);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    for (const r of runs) {
      expect(r.ddp.commHook.name).toBe('fp16_compress');
      // A 2-rank ring sends each element once: 2 bytes in float16 (4 in float32), plus frame headers.
      expect(r.ddp.bytesPerStep).toBeGreaterThanOrEqual(2 * r.ddp.parameterCount);
      expect(r.ddp.bytesPerStep).toBeLessThan(3 * r.ddp.parameterCount);
    }
    await closeAll(runs);
  });

  it("powerSGD: replicas stay bit-identical every step, the loss goes down, the hook counts the run's steps", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('psgd');
    const members = [0, 1].map((id) => member(net, id, session, { min: 2, max: 2, steps: 20, checkReplicasEvery: 1, commHook: psgd }));
    const runs = await Promise.all(members.map((m) => m.result));
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    for (const m of members) {
      const hook = m.hooks[0] as PowerSGDHook;
      expect(m.hooks).toHaveLength(1);
      expect(hook.iteration).toBe(20);
      expect(hook.lastStats.elementsSent).toBeLessThan(hook.lastStats.elementsDense / 2);
    }
    const l = losses(members[0]!);
    expect(l).toHaveLength(20);
    expect(mean(l.slice(-4))).toBeLessThan(mean(l.slice(0, 4)));
    expect(bits(members[0]!.hooks[0]!.stateDict!())!.tensors).not.toEqual(bits(members[1]!.hooks[0]!.stateDict!())!.tensors); // errors are each rank's
    expect(shared(members[0]!.hooks[0]!.stateDict!())).toEqual(shared(members[1]!.hooks[0]!.stateDict!())); // Q's are everyone's
    await closeAll(runs);
  });

  it("the hook's state is saved with a checkpoint and loaded on resume: whole on rank 0, the Q's elsewhere", async () => {
    const net = new MemoryNetwork();
    const source = uniqueSession('psgd-ckpt');
    const before = [0, 1].map((id) => member(net, id, source, { min: 2, max: 2, steps: 6, checkpointEvery: 3, commHook: psgd }));
    const runsBefore = await Promise.all(before.map((m) => m.result));
    const rank0 = before[runsBefore.findIndex((r) => r.rank === 0)]!;
    const saved = rank0.hooks[0]!.stateDict!();
    expect(saved.meta.iter).toBe(6);
    expect(Object.keys(saved.tensors).some((k) => k.startsWith('error:'))).toBe(true);
    await closeAll(runsBefore);

    // What the file holds: rank 0's hook state at step 6, after the optimizer's own tensors.
    const loaded = await loadCheckpoint(server.url, source, { token: tokenFor(source) });
    expect(loaded!.checkpoint.meta.step).toBe(6);
    const split = splitCommHookState(loaded!.checkpoint.meta, loaded!.checkpoint.optimizer);
    expect(bits(split.commHook)).toEqual(bits(saved));
    expect(split.optimizer.weightSpecs.some((s) => s.name.startsWith('commHook/'))).toBe(false);

    const session = uniqueSession('psgd-resumed');
    const atRound: Array<{ rank: number; step: number; state: CommHookState | null }> = [];
    const after = [0, 1].map((id) =>
      member(net, id + 10, session, {
        min: 2,
        max: 2,
        steps: 9,
        resumeFrom: source,
        checkReplicasEvery: 1,
        commHook: psgd,
        onRound: (ctx) => void atRound.push({ rank: ctx.pg.rank, step: ctx.step, state: ctx.ddp.commHookState() }),
      }),
    );
    const runsAfter = await Promise.all(after.map((m) => m.result));
    expect(atRound.map((r) => r.step)).toEqual([6, 6]);
    for (const { rank, state } of atRound) {
      if (rank === 0) expect(bits(state)).toEqual(bits(saved));
      else expect(bits(state)).toEqual(shared(saved)); // no errors: rank 0's are not this rank's
    }
    for (const m of after) expect((m.hooks[0] as PowerSGDHook).iteration).toBe(9); // the DDP numbered steps 7, 8, 9
    expect(new Set(runsAfter.map((r) => r.weightHash)).size).toBe(1);
    await closeAll(runsAfter);
  });

  it("a joiner's hook starts from the source's Q's; the survivors keep their own state", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('psgd-join');
    let joiner: Member | undefined;
    /** Each member's hook state after its latest step. */
    const lastStep = new Map<Member, CommHookState | null>();
    /** Each member's hook state as each round starts (after the state transfer), and as its previous step left it. */
    const rounds: Array<{
      who: Member;
      rank: number;
      step: number;
      state: CommHookState | null;
      before: CommHookState | null | undefined;
    }> = [];
    const opts = (self: () => Member): MemberOptions => ({
      min: 2,
      max: 3,
      steps: 12,
      checkReplicasEvery: 1,
      commHook: psgd,
      onRound: (ctx) =>
        void rounds.push({ who: self(), rank: ctx.pg.rank, step: ctx.step, state: ctx.ddp.commHookState(), before: lastStep.get(self()) }),
      onStep: (ctx) => void lastStep.set(self(), ctx.ddp.commHookState()),
    });
    const first: Member[] = [];
    for (const id of [0, 1]) {
      const m: Member = member(net, id, session, {
        ...opts(() => m),
        extra: async (ctx) => {
          if (ctx.step === 4 && ctx.pg.rank === 0 && !joiner) {
            const j: Member = member(
              net,
              2,
              session,
              opts(() => j),
            );
            joiner = j;
          }
        },
      });
      first.push(m);
    }
    const done = await Promise.all(first.map((m) => m.result));
    const all = [...done, await joiner!.result];
    expect(all.map((r) => r.worldSize)).toEqual([3, 3, 3]);
    expect(all.map((r) => r.steps)).toEqual([12, 12, 12]);
    expect(new Set(all.map((r) => r.weightHash)).size).toBe(1);
    for (const m of [...first, joiner!]) expect((m.hooks[0] as PowerSGDHook).iteration).toBe(12);

    const second = rounds.filter((r) => r.step > 0);
    expect(second).toHaveLength(3);
    const step = second[0]!.step;
    expect(step).toBeGreaterThanOrEqual(4);
    expect(second.every((r) => r.step === step)).toBe(true);
    const source = second.find((r) => r.rank === 0)!;
    expect(first).toContain(source.who);
    const joined = second.find((r) => r.who === joiner)!;
    expect(joined.before).toBeUndefined();
    expect(joined.state!.meta.iter).toBe(step);
    expect(Object.keys(joined.state!.tensors).length).toBeGreaterThan(0);
    expect(bits(joined.state)).toEqual(shared(source.state)); // warm: the source's Q's, no errors
    for (const r of second.filter((x) => x.who !== joiner)) {
      expect(Object.keys(r.state!.tensors).some((k) => k.startsWith('error:'))).toBe(true);
      expect(bits(r.state)).toEqual(bits(r.before!)); // its own, errors included
    }
    await closeAll(all);
  });

  it("a joiner whose hook is another kind than the group's ends its own run; the group goes on", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('hook-mismatch');
    let joiner: Member | undefined;
    const first = [0, 1].map((id) =>
      member(net, id, session, {
        min: 2,
        max: 3,
        steps: 10,
        checkReplicasEvery: 1,
        commHook: psgd,
        extra: async (ctx) => {
          if (ctx.step === 3 && ctx.pg.rank === 0 && !joiner)
            joiner = member(net, 2, session, { min: 2, max: 3, steps: 10, commHook: fp16CompressHook });
        },
      }),
    );
    const done = await Promise.all(first.map((m) => m.result));
    await expect(joiner!.result).rejects.toThrow(
      /this rank's communication hook is fp16_compress, but the group's \(rank 0's\) is powerSGD/,
    );
    expect(done.map((r) => [r.steps, r.worldSize])).toEqual([
      [10, 2],
      [10, 2],
    ]);
    expect(new Set(done.map((r) => r.weightHash)).size).toBe(1);
    await closeAll(done);
  });

  it('post-local SGD with a model averager: replicas identical exactly at averaging steps, checked only there', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('lsgd');
    const hashes: Array<Map<number, string>> = [new Map(), new Map()];
    const members = [0, 1].map((id) =>
      member(net, id, session, {
        min: 2,
        max: 2,
        steps: 10,
        checkReplicasEvery: 1,
        commHook: () => postLocalSGD({ startStep: 2 }),
        modelAverager: { period: 4, warmupSteps: 2 },
        onStep: async (ctx) => void hashes[ctx.pg.rank]!.set(ctx.step, await ctx.ddp.weightsHash()),
      }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    expect(runs.map((r) => r.steps)).toEqual([10, 10]);
    const same = Array.from({ length: 10 }, (_, k) => hashes[0]!.get(k + 1) === hashes[1]!.get(k + 1));
    // Steps 1-2 average gradients; 3-5 and 7-9 are local; 6 and 10 average the weights.
    expect(same).toEqual([true, true, false, false, false, true, false, false, false, true]);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1); // the run ends on an averaging step
    await closeAll(runs);
  });

  it('post-local SGD: a run that ends between averagings averages once more at its end', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('lsgd-end');
    const hashes: Array<Map<number, string>> = [new Map(), new Map()];
    const members = [0, 1].map((id) =>
      member(net, id, session, {
        min: 2,
        max: 2,
        steps: 8,
        commHook: () => postLocalSGD({ startStep: 2 }),
        modelAverager: { period: 4, warmupSteps: 2 },
        onStep: async (ctx) => void hashes[ctx.pg.rank]!.set(ctx.step, await ctx.ddp.weightsHash()),
      }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    // Averaged after step 6; steps 7 and 8 local, so the replicas differ after the last step ...
    expect(hashes[0]!.get(8)).not.toBe(hashes[1]!.get(8));
    // ... and the run's end averages them: one model everywhere.
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    await closeAll(runs);
  });

  it('post-local SGD: a run that ends with its epoch averages before the epoch-end hook (an evaluation there sees the one model)', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('lsgd-epoch');
    const atEnd: string[] = [];
    // 120 samples, 2 x 4 per step: one epoch is 15 steps; averagings after 6, 10 and 14.
    const members = [0, 1].map((id) =>
      member(net, id, session, {
        min: 2,
        max: 2,
        commHook: () => postLocalSGD({ startStep: 2 }),
        modelAverager: { period: 4, warmupSteps: 2 },
        onEpochEnd: async (ctx) => void atEnd.push(await ctx.ddp.weightsHash()),
      }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    expect(runs.map((r) => r.steps)).toEqual([15, 15]);
    expect(atEnd).toHaveLength(2);
    expect(atEnd[0]).toBe(atEnd[1]);
    expect(runs[0]!.weightHash).toBe(atEnd[0]);
    await closeAll(runs);
  });
});

describe("a hook's state in a checkpoint's optimizer section", () => {
  it('goes after the optimizer tensors and comes back bit for bit; a checkpoint without it loads as before', async () => {
    const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 0 });
    const opt = tf.train.adam(0.01);
    opt.minimize(() => tf.tidy(() => (model.apply(tf.ones([2, 16])) as tf.Tensor).square().mean() as tf.Scalar));
    const bundle = await optimizerState(opt);
    const state: CommHookState = {
      name: 'powerSGD',
      meta: { iter: 7, seed: 0, note: 'x', flag: true, none: null },
      tensors: { 'q:0/1': Float32Array.of(1, -2, 3.5), 'error:0/1': Float32Array.of(0.25, NaN, -0) },
    };
    const { optimizer, header } = appendCommHookState(bundle, state);
    expect(optimizer.weightSpecs.slice(-2)).toEqual([
      { name: 'commHook/q:0/1', shape: [3], dtype: 'float32' },
      { name: 'commHook/error:0/1', shape: [3], dtype: 'float32' },
    ]);
    const meta = JSON.parse(JSON.stringify({ step: 7, commHook: header })) as Record<string, unknown>;
    const back = splitCommHookState(meta, optimizer);
    expect(bits(back.commHook)).toEqual(bits(state));
    expect(back.optimizer.weightSpecs).toEqual(bundle.weightSpecs);
    expect(hex(new Float32Array(back.optimizer.weightData))).toBe(hex(new Float32Array(bundle.weightData)));

    // Old checkpoints: no meta.commHook, the section is the optimizer's alone.
    const old = splitCommHookState({ step: 7 }, bundle);
    expect(old.commHook).toBeNull();
    expect(old.optimizer).toBe(bundle);
    expect(appendCommHookState(bundle, null)).toEqual({ optimizer: bundle, header: null });

    // A meta that does not match the section is a corrupt checkpoint.
    const wrong = JSON.parse(
      JSON.stringify({
        commHook: {
          ...header,
          tensors: [
            { name: 'q:0/1', length: 4 },
            { name: 'error:0/1', length: 3 },
          ],
        },
      }),
    ) as Record<string, unknown>;
    expect(() => splitCommHookState(wrong, optimizer, 'ckpt-x')).toThrow(CheckpointCorruptError);
    expect(() => splitCommHookState({ commHook: { name: 'p', meta: { a: {} }, tensors: [] } }, optimizer)).toThrow(
      errorOf(CheckpointCorruptError, /meta's "a" is not a number/),
    );
    opt.dispose();
    model.dispose();
  });
});
