/**
 * A hostile member (test/fixtures/hostile_member.ts) in a session of every strategy: 3 honest
 * ranks and 1 hostile rank that runs the honest code and plays each attack on the side (Node,
 * TF.js cpu backend, in-memory links, the real server). What each test shows is in its name.
 * Runs are tiny (an MLP, synthetic data, 6 steps); "the clean run" is the same run with all 4
 * ranks honest, and "= clean" means the honest ranks end with its weights bit for bit.
 *
 * What each attack gets today (measured here; [T] = a test below asserts it):
 *
 * | attack                             | DDP (runElastic)             | DiLoCo (runElastic)          | pipeline (2 stages x 2)       | parameter server             |
 * | ---------------------------------- | ---------------------------- | ---------------------------- | ----------------------------- | ---------------------------- |
 * | 1a vote rows: twice (open or done) | refused BAD_MESSAGE, = clean [T] | same [T]                 | same [T]                      | no vote (server 0 decides) [T] |
 * | 1b vote rows: other rounds         | refused GATHER_ABORTED [T]   | same [T]                     | same [T]                      | same [T]                     |
 * | 1c vote rows: a socket without rank| refused NOT_JOINED [T]       | same [T]                     | same [T]                      | same [T]                     |
 * | 1d own tags, more than its budget  | refused past MAX_OPEN_GATHERS (its own budget); honest votes never refused [T] | same server code | same server code | no vote          |
 * | 1e old trick: rows on ddp.carry    | mean: CollectiveMismatchError on every rank (a), nobody stopped in another's name [T]; robust: refused on its own rank [T] | not carried (DiLoCo's hook) | CollectiveMismatchError on its stage's replicas (a), the other stage waits out `timeoutMs` as in (d) | no DDP |
 * | 2 signals naming other pairs       | dropped by the honest links (pool: attested member; per-round links: attested rank), no round fails, = clean [T] | same [T] | same [T] | same [T] |
 * | 3 closeRendezvous mid-run          | only itself done: honest ranks not told, = clean [T]; closes and leaves: next round without it [T] | same [T] | same [T] | same [T] |
 * | 4 floods                           | named refusals, socket closed 4001, the session and another train on [T] (b) | same server code | same server code | same server code |
 * | 5 NaN contribution                 | mean: NonFiniteGradientError everywhere, nothing applied, the run ends [T]; trimmed mean: refused and judged, honest train on [T] | mean: NonFiniteWeightsError (outer step) everywhere, the run ends [T]; trimmed mean: refused, honest train on (c) [T] | no check at the stage boundary; DDP refuses the stage's NaN gradients: NonFiniteGradientError on the last stage's ranks, the first stage's wait out the runner's timeout (d) [T] | async: the shard refuses ('nonfinite', counted), honest train on [T]; central: refused (worker's count), its next push completes the step, = clean [T] (e) |
 * | 6 finite x1000 contribution        | mean: ~7e5 x the clean run's progress off; trimmed mean 0.29, centered clip 0.23; replicas identical [T] | mean ~1.5e4; trimmed mean 0.27, centered clip 0.18 [T] | NOT DEFENDED: the hostile stage's replica all-reduce and upstream stage take it, ~1e3-5e6 x the weights' norm off (replicas identical) | NOT DEFENDED: applied (central ~8e6, async ~7e3 x progress off) |
 *
 * (a) A mismatched collective ends the run for everyone, naming the ranks: any member can do that
 *     (hostile_peers.test.ts); what it cannot do any more is stop the run in rank 0's name.
 * (b) UNKNOWN_PEER (not counted), BAD_MESSAGE, UNKNOWN_TYPE, NOT_JOINED, RATE_LIMITED for failed
 *     regroups past the member's budget and for joins past the join rate; each failed regroup
 *     within the budget forms a round (the others redo a state transfer): a bounded cost.
 * (c) Its own weights are NaN, so its own outer-step merge refuses them and it leaves (elastic).
 * (d) The last stage fails inside its all-reduce before it sends its last activation gradient;
 *     the first stage's ranks then wait for the group to be whole again, up to `timeoutMs`
 *     (300 s by default), and end with DistTimeoutError, which does not name the NaN.
 * (e) A worker that pushes NaN at every step is refused every time and holds every worker's
 *     synchronous step for as long as it goes on (measured: 3,700 refused pushes in 8 s, no
 *     progress); not tested here.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { runElastic, type ElasticRunResult } from '../src/parallel/ddp/runner.ts';
import { runPipeline, type PipelineRunResult } from '../src/parallel/pipeline/runner.ts';
import { runParameterServer, type ParameterServerRunResult } from '../src/parallel/parameter_server/runner.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { buildModel, classificationLoss, type LayerFactory } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { SGD } from '../src/nn/optim.ts';
import { DiLoCo } from '../src/parallel/diloco/diloco.ts';
import type { AggregationSpec } from '../src/parallel/robust/aggregators.ts';
import type { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { flatTrainableWeights } from '../src/parallel/replicas.ts';
import { flatGradients } from '../src/parallel/parameter_server/worker.ts';
import { hashFloat32 } from '../src/wire/hash.ts';
import { NonFiniteGradientError, NonFiniteWeightsError } from '../src/wire/errors.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { MAX_OPEN_GATHERS } from '../src/wire/protocol.ts';
import { groupSize, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';
import {
  HostileMember,
  hostileBackward,
  hostileLoss,
  hostileOuterWeights,
  playOn,
  recordSignals,
  type Attempt,
  type FloodReport,
  type ValueAttack,
} from './fixtures/hostile_member.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'ddp-hostile-')) });
});
afterAll(async () => {
  await server.close();
});

const data = syntheticDataset({ length: 256, inputSize: 16, numClasses: 4, seed: 3 });
const mlp = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 7 });
const lossOf = (out: tf.Tensor, y: tf.Tensor) => classificationLoss(out, y, 4);
/** The pipeline's model: 16 -> 24 -> 20 -> 4, seeded per layer, split in 2 stages. */
const layers = (): LayerFactory[] =>
  [24, 20, 4].map(
    (units, i) => (inputShape?: number[]) =>
      tf.layers.dense({
        units,
        activation: i < 2 ? 'relu' : 'linear',
        kernelInitializer: tf.initializers.glorotUniform({ seed: 70 + i }),
        ...(inputShape ? { inputShape } : {}),
      }),
  );
const STEPS = 6;
const BATCH = 8;
const WORLD = 4;
/** The hostile member's rank (fixed-size runs ask for it; the others join it last). */
const HOSTILE = 3;
const SYNC_EVERY = 2;

type Kind = 'ddp' | 'diloco' | 'pipeline' | 'ps';
const KINDS: Kind[] = ['ddp', 'diloco', 'pipeline', 'ps'];

/** What the hostile rank does besides its honest step. */
interface Mischief {
  /** At the start of its step `step` (before it computes): the protocol-level attacks. */
  during?(h: HostileMember, step: number, ddp: DistributedDataParallel | null): Promise<Attempt[] | Attempt | undefined>;
  /** From step `from` on, its own contribution is spoiled. */
  spoil?: { from: number; attack: ValueAttack };
  /** Spoil one contribution only (the first at or after `spoil.from`). */
  spoilOnce?: boolean;
}

/** `f` at the hostile rank's step `step`, once (a step trained again after a failed round does not play it again). */
function once(
  step: number,
  f: (h: HostileMember, ddp: DistributedDataParallel | null) => Promise<Attempt[] | Attempt | undefined> | Attempt,
): NonNullable<Mischief['during']> {
  let played = false;
  return async (h, s, ddp) => {
    if (s !== step || played) return;
    played = true;
    return f(h, ddp);
  };
}

interface RunSpec {
  kind: Kind;
  /** The hostile rank's mischief; none: every rank honest (the clean run). */
  mischief?: Mischief;
  aggregation?: AggregationSpec;
  reuseLinks?: boolean;
  /** Elastic 3..4 (the hostile rank joins last) instead of a fixed size of 4 (ddp and diloco only). */
  elastic?: boolean;
  /** The hostile rank's place in a pipeline (3: stage 1 of replica 1; 2: stage 0 of replica 1). */
  hostileRank?: number;
  on?: RunningServer;
  session?: string;
  /** Awaited by every honest rank at the end of this step, after its optimizer step (before its vote). */
  holdAt?: { step: number; until: Promise<unknown> };
  strategy?: 'central' | 'async';
  /** The runners' timeout (blocking calls, waiting for a round). Default 10 s. */
  timeoutMs?: number;
  /** Fail (naming the honest ranks' failed rounds) if the run has not ended by then. */
  deadlineMs?: number;
}

interface RankOutcome {
  hostile: boolean;
  /** The rank it asked for (fixed sizes) or joined as. */
  rank: number;
  error: unknown;
  steps: number;
  stoppedBy: number | string | null;
  generations: number;
  /** Its final weights (a pipeline rank's: its stage's). */
  weights: Float32Array | null;
  /** Its model (a pipeline rank's: its stage's), after the run; for a run that failed, what it holds. */
  model: tf.LayersModel | null;
  /** The world size of each round it trained in. */
  worlds: number[];
  failures: string[];
  /** A rendezvous 'closed' event reached it. */
  closedHeard: boolean;
  /** Each vote's metrics, every rank's, as this rank read them. */
  votes: Array<Array<Record<string, number | null>>>;
  /** Signal bodies of the hostile member that reached its links. */
  forgedFed: () => number;
  /** The robust aggregation's judgment of the hostile rank, per step (status). */
  judged: string[];
  ps: ParameterServerRunResult | null;
}

interface Run {
  ranks: RankOutcome[];
  honest: RankOutcome[];
  hostile: RankOutcome | null;
  attempts: Attempt[];
  member: HostileMember | null;
}

function emptyOutcome(rank: number, hostile: boolean, model: tf.LayersModel | null, forgedFed: () => number): RankOutcome {
  return {
    hostile,
    rank,
    error: null,
    steps: 0,
    stoppedBy: null,
    generations: 0,
    weights: null,
    model,
    worlds: [],
    failures: [],
    closedHeard: false,
    votes: [],
    forgedFed,
    judged: [],
    ps: null,
  };
}

/** One batch's tensors (disposed after `fn`). */
async function withBatch<T>(indices: number[], fn: (xs: tf.Tensor, ys: tf.Tensor) => Promise<T>): Promise<T> {
  const { x, y } = data.batch(indices);
  const xs = tf.tensor(x, [indices.length, 16]);
  const ys = tf.tensor1d(y, 'int32');
  try {
    return await fn(xs, ys);
  } finally {
    tf.dispose([xs, ys]);
  }
}

/** One member of a run: its runner started with the hostile member's connection when it is the hostile one. */
function startMember(
  spec: RunSpec,
  srv: RunningServer,
  session: string,
  net: MemoryNetwork,
  rank: number,
  member: HostileMember | null,
  attempts: Attempt[],
): { out: RankOutcome; done: Promise<void> } {
  const hostile = member !== null;
  const mischief = hostile ? spec.mischief : undefined;
  const signals = recordSignals(net.factoryFor(rank));
  const common = {
    url: srv.url,
    session,
    token: tokenFor(session),
    timeoutMs: spec.timeoutMs ?? 10_000,
    heartbeatIntervalMs: 200,
    failedRoundGraceMs: 300,
    linkTimeoutMs: 3_000,
    linkFactory: signals.factory,
    reuseLinks: spec.reuseLinks ?? false,
    ...(member ? { store: member.client } : {}),
    batchSize: BATCH,
    steps: STEPS,
    seed: 1,
  };
  const hold = async (step: number) => {
    if (!hostile && spec.holdAt?.step === step) await spec.holdAt.until;
  };
  const during = async (step: number, ddp: DistributedDataParallel | null) => {
    if (!hostile) return;
    const got = await mischief?.during?.(member!, step, ddp);
    if (got) attempts.push(...(Array.isArray(got) ? got : [got]));
  };
  let spoiled = 0;
  const spoil = (step: number): ValueAttack | null => {
    if (!mischief?.spoil || step < mischief.spoil.from || (mischief.spoilOnce && spoiled > 0)) return null;
    spoiled++;
    return mischief.spoil.attack;
  };

  if (spec.kind === 'ddp' || spec.kind === 'diloco') {
    const state = new TrainState({ model: mlp(), optimizer: () => new SGD({ lr: 0.1 }) });
    const out = emptyOutcome(rank, hostile, state.model, signals.forged);
    const size = spec.elastic ? { min: WORLD - 1, max: WORLD, checkpointAtEpochEnd: false } : { min: WORLD, max: WORLD, rank };
    const result = runElastic({
      ...common,
      ...size,
      state,
      datasetLength: data.length,
      ...(spec.kind === 'diloco'
        ? { diloco: { syncEvery: SYNC_EVERY, ...(spec.aggregation ? { aggregation: spec.aggregation } : {}) } }
        : spec.aggregation
          ? { ddp: { aggregation: spec.aggregation } }
          : {}),
      onEvent: (e) => {
        if (e.type === 'failure') out.failures.push(e.error);
        if (e.type === 'round') out.worlds.push(e.worldSize);
      },
      onRendezvous: (e) => {
        if (e.type === 'closed') out.closedHeard = true;
      },
      onStep: ({ metrics, ddp }) => {
        out.votes.push(metrics);
        const hook = ddp.commHook;
        const judgment = hook instanceof DiLoCo ? hook.lastAggregation?.judgments[HOSTILE] : undefined;
        if (judgment) out.judged.push(judgment.status);
      },
      async step({ indices, ddp, optimizer, step, pg }) {
        await during(step, ddp);
        const attack = spoil(step);
        const { loss } = await withBatch(indices, (xs, ys) => {
          const lossFn = () => lossOf(ddp.model.apply(xs) as tf.Tensor, ys);
          return attack && spec.kind === 'ddp' ? hostileBackward(ddp, lossFn, attack) : ddp.backward(lossFn);
        });
        const judgment = ddp.lastAggregation?.judgments[HOSTILE];
        if (judgment) out.judged.push(judgment.status);
        await ddp.step(optimizer);
        if (attack && spec.kind === 'diloco' && step % SYNC_EVERY === 0) await hostileOuterWeights(ddp, attack);
        await hold(step);
        return { loss, rank: pg.rank };
      },
    });
    return { out, done: settleElastic(result, out) };
  }

  if (spec.kind === 'pipeline') {
    const out = emptyOutcome(rank, hostile, null, signals.forged);
    const result = runPipeline({
      ...common,
      rank,
      stages: 2,
      replicas: 2,
      layers: layers(),
      inputShape: [16],
      optimizer: () => new SGD({ lr: 0.1 }),
      datasetLength: data.length,
      onEvent: (e) => {
        if (e.type === 'failure') out.failures.push(e.error);
      },
      onRound: ({ stage }) => {
        out.model = stage.model;
      },
      onStep: ({ metrics }) => {
        out.votes.push(metrics);
      },
      async step({ indices, stage, ddp, optimizer, step, mesh }) {
        await during(step, ddp);
        const attack = spoil(step);
        const { x, y } = data.batch(indices);
        const inputs = stage.isFirst ? (attack ? playOn(Float32Array.from(x), attack) : x) : undefined;
        const loss = attack && stage.isLast ? hostileLoss(lossOf, attack) : lossOf;
        const r = await stage.step({
          ddp,
          batchSize: indices.length,
          microBatches: 2,
          ...(inputs ? { inputs } : {}),
          ...(stage.isLast ? { labels: Int32Array.from(y), loss } : {}),
        });
        await ddp.step(optimizer);
        await hold(step);
        return { loss: stage.isLast ? r.loss : 0, rank: mesh.world.rank };
      },
    });
    return { out, done: settlePipeline(result, out) };
  }

  const model = mlp();
  const out = emptyOutcome(rank, hostile, model, signals.forged);
  const result = runParameterServer({
    ...common,
    max: WORLD,
    min: WORLD,
    strategy: spec.strategy ?? 'central',
    model,
    // A shard's optimizer is a TF.js one (it applies pushes on the device).
    optimizer: () => tf.train.sgd(0.1),
    datasetLength: data.length,
    onEvent: (e) => {
      if (e.type === 'failure') out.failures.push(e.error);
    },
    onRendezvous: (e) => {
      if (e.type === 'closed') out.closedHeard = true;
    },
    async step({ indices, model: m, stepId, pg }) {
      await during(stepId, null);
      const attack = spoil(stepId);
      const { loss, grads } = await withBatch(indices, (xs, ys) => flatGradients(m, () => lossOf(m.apply(xs) as tf.Tensor, ys)));
      out.rank = pg.rank;
      return { grads: attack ? playOn(grads, attack) : grads, metrics: { loss } };
    },
  });
  return { out, done: settlePs(result, out) };
}

async function settleElastic(result: Promise<ElasticRunResult>, out: RankOutcome): Promise<void> {
  try {
    const r = await result;
    Object.assign(out, { steps: r.steps, stoppedBy: r.stoppedBy, generations: r.generations, weights: await r.ddp.flatWeights() });
    await r.close();
  } catch (err) {
    out.error = err;
  }
}

async function settlePipeline(result: Promise<PipelineRunResult>, out: RankOutcome): Promise<void> {
  try {
    const r = await result;
    Object.assign(out, {
      steps: r.steps,
      stoppedBy: r.stoppedBy,
      generations: r.generations,
      weights: await r.ddp.flatWeights(),
      model: r.stage.model,
    });
    await r.close();
  } catch (err) {
    out.error = err;
  }
}

async function settlePs(result: Promise<ParameterServerRunResult>, out: RankOutcome): Promise<void> {
  try {
    const r = await result;
    Object.assign(out, {
      steps: r.versions[0]!,
      stoppedBy: r.stoppedBy,
      generations: r.generations,
      weights: await flatTrainableWeights(r.model),
      ps: r,
    });
    await r.close();
  } catch (err) {
    out.error = err;
  }
}

/** 3 honest ranks and the hostile one (or 4 honest ranks: the clean run), to the end of every rank's run. */
async function run(spec: RunSpec): Promise<Run> {
  const srv = spec.on ?? server;
  const session = spec.session ?? uniqueSession(`hostile-${spec.kind}`);
  const net = new MemoryNetwork();
  const attempts: Attempt[] = [];
  const hostileRank = spec.kind === 'pipeline' ? (spec.hostileRank ?? HOSTILE) : HOSTILE;
  const honestRanks = Array.from({ length: WORLD }, (_, r) => r).filter((r) => r !== hostileRank);
  const started = honestRanks.map((r) => startMember(spec, srv, session, net, r, null, attempts));
  // The hostile member joins last: the rank the others leave it (elastic and parameter-server runs cannot ask for one).
  await waitFor('the honest ranks to join', () => groupSize(srv, session) === WORLD - 1, { timeoutMs: 10_000 });
  const member = spec.mischief ? await HostileMember.connect({ url: srv.url, session, token: tokenFor(session) }) : null;
  const last = startMember(spec, srv, session, net, hostileRank, member, attempts);
  const ended = Promise.all([...started, last].map((s) => s.done));
  if (spec.deadlineMs === undefined) await ended;
  else {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const failures = started.flatMap((s) => s.out.failures.map((f) => `rank ${s.out.rank}: ${f}`));
        reject(
          new Error(`the run did not end within ${spec.deadlineMs} ms; the honest ranks' failed rounds: ${failures.join('; ') || 'none'}`),
        );
      }, spec.deadlineMs);
    });
    await Promise.race([ended, late]).finally(() => clearTimeout(timer));
  }
  member?.close();
  const ranks = [...started.map((s) => s.out), last.out].sort((a, b) => a.rank - b.rank);
  return { ranks, honest: ranks.filter((r) => !r.hostile), hostile: spec.mischief ? last.out : null, attempts, member };
}

const cleanRuns = new Map<Kind, Promise<Run>>();
/** The run with every rank honest (once per strategy; the parameter server's is CentralStorage, deterministic). */
function clean(kind: Kind): Promise<Run> {
  let r = cleanRuns.get(kind);
  if (!r) {
    r = run({ kind });
    cleanRuns.set(kind, r);
  }
  return r;
}

const hash = (w: Float32Array | null) => (w === null ? null : hashFloat32(w));

function distance(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += (a[i]! - b[i]!) ** 2;
  return Math.sqrt(s);
}

function allFinite(w: Float32Array): boolean {
  return w.every((v) => Number.isFinite(v));
}

/** Every honest rank ran to the end, stopped by nobody, without a failed round, and none was told the run was over. */
function expectTrainedOn(r: Run, kind: Kind): void {
  for (const o of r.honest) {
    expect(o.error, `honest rank ${o.rank}`).toBeNull();
    expect(o.steps, `honest rank ${o.rank}'s steps`).toBe(STEPS);
    expect(o.stoppedBy, `honest rank ${o.rank}`).toBe(kind === 'ps' ? 'done' : null);
    expect(o.failures, `honest rank ${o.rank}'s failed rounds`).toEqual([]);
    expect(o.closedHeard, `honest rank ${o.rank} heard the run was closed`).toBe(false);
  }
}

/** Every honest rank ends with the clean run's weights, bit for bit (the hostile rank's mischief changed nothing). */
async function expectCleanWeights(r: Run, kind: Kind): Promise<void> {
  const c = await clean(kind);
  for (const o of r.honest) expect(hash(o.weights), `honest rank ${o.rank}'s weights`).toBe(hash(c.ranks[o.rank]!.weights));
}

/** In every vote an honest rank read, each honest rank's row is its own: its metrics name its rank. */
function expectOwnRows(r: Run): void {
  for (const o of r.honest) {
    expect(o.votes.length, `honest rank ${o.rank}'s votes`).toBeGreaterThan(0);
    for (const v of o.votes)
      for (const h of r.honest) expect(v[h.rank]!.rank, `rank ${h.rank}'s row as rank ${o.rank} read it`).toBe(h.rank);
  }
}

describe('a hostile member: forged vote rows', () => {
  it.each(KINDS)(
    '%s: rows for its own gathers again (open and completed), for other rounds, and from a connection without a rank are refused; the run is the clean run',
    async (kind) => {
      // The honest ranks wait at the end of step 3 until the second row behind the hostile rank's own
      // next one is answered: that gather is then still open (a parameter-server run has no vote).
      let behind: Attempt | null = null;
      let answered!: () => void;
      const open = new Promise<void>((resolve) => (answered = resolve));
      const r = await run({
        kind,
        ...(kind === 'ps' ? {} : { holdAt: { step: 3, until: open } }),
        mischief: {
          during: once(3, async (h) => {
            const forged = await h.forgeVoteRows();
            if (kind !== 'ps') {
              void h.secondRowBehindOwn().then((a) => {
                behind = a;
                answered();
              });
            }
            return forged;
          }),
        },
      });
      if (kind !== 'ps') {
        expect(behind).not.toBeNull();
        expect(behind!.code, behind!.message).toBe('BAD_MESSAGE');
        expect(behind!.message).toMatch(/gave its row of gather .* already: one row per rank/);
      }
      expectTrainedOn(r, kind);
      await expectCleanWeights(r, kind);
      if (kind !== 'ps') expectOwnRows(r);
      // Its own tags again: one row per rank and tag (open or completed).
      const own = r.attempts.filter((a) => a.what.startsWith('a second row'));
      if (kind !== 'ps') expect(own.length, 'its own gathers so far').toBeGreaterThanOrEqual(2);
      for (const a of own) expect(a.code, a.what).toBe('BAD_MESSAGE');
      // Other rounds: only the running round's ranks give rows, to the running round.
      const rounds = r.attempts.filter((a) => a.what.includes('not the running round'));
      expect(rounds.length).toBeGreaterThan(0);
      for (const a of rounds) expect(a.code, a.what).toBe('GATHER_ABORTED');
      // A connection holding no rank has no row to give.
      expect(r.attempts.filter((a) => a.what.includes('second connection')).map((a) => a.code)).toEqual(['NOT_JOINED']);
    },
  );

  it("ddp: the old trick (a stop in rank 0's row riding on the gradients' sum) no longer matches the honest ranks' all-reduce: every rank fails naming a mismatch, and no rank stops in another's name", async () => {
    const r = await run({
      kind: 'ddp',
      mischief: {
        during: once(3, (h, ddp) => h.forgeCarriedRows(ddp!)),
      },
    });
    expect(r.attempts.map((a) => a.code)).toEqual([null]);
    for (const o of r.ranks) {
      expect(o.stoppedBy, `rank ${o.rank}`).toBeNull();
      expect((o.error as Error | null)?.name, `rank ${o.rank}: ${String(o.error)}`).toBe('CollectiveMismatchError');
    }
  });

  it('ddp under a trimmed mean: the library refuses to carry anything on its own rank, and the run trains on', async () => {
    const r = await run({
      kind: 'ddp',
      aggregation: { kind: 'trimmed-mean', trim: 1 },
      mischief: {
        during: once(3, (h, ddp) => h.forgeCarriedRows(ddp!)),
      },
    });
    expectTrainedOn(r, 'ddp');
    expect(r.attempts.map((a) => a.code)).toEqual(['THROWN']);
    expect(r.attempts[0]!.message).toMatch(/carry: values cannot ride on the gradients under robust aggregation/);
  });

  it("ddp, elastic 3..4: gathers under tags of its own fill only its own budget (MAX_OPEN_GATHERS): the honest ranks' votes are never refused and they train to the end", async () => {
    const r = await run({
      kind: 'ddp',
      elastic: true,
      mischief: {
        during: once(3, async (h) => {
          const out: Attempt[] = [];
          // Each waits 50 ms (nobody else gives a row to these tags) and stays open.
          for (let i = 0; i < MAX_OPEN_GATHERS + 1; i++) {
            out.push(
              await h.giveRow(h.latest.round, `own-${i}`, [1], 50).then(
                (): Attempt => ({ what: `own tag ${i}`, code: null, message: 'taken' }),
                (err: Error & { code?: string }): Attempt => ({ what: `own tag ${i}`, code: err.code ?? err.name, message: err.message }),
              ),
            );
          }
          return out;
        }),
      },
    });
    // Past its budget its own tags are refused; its own next vote may be too (then it fails and leaves, and the next round is the honest ranks').
    expect(r.attempts.filter((a) => a.code === 'TIMEOUT').length).toBeGreaterThanOrEqual(MAX_OPEN_GATHERS - 1);
    expect(r.attempts.at(-1)!.code).toBe('BAD_MESSAGE');
    expect(r.attempts.at(-1)!.message).toMatch(/the most one rank may \(MAX_OPEN_GATHERS\)/);
    for (const o of r.honest) {
      expect(o.error, `honest rank ${o.rank}`).toBeNull();
      expect(o.steps).toBe(STEPS);
      expect(o.stoppedBy).toBeNull();
      expect(
        o.failures.filter((f) => /gather/.test(f)),
        `honest rank ${o.rank}'s votes refused`,
      ).toEqual([]);
    }
    expect(new Set(r.honest.map((o) => hash(o.weights))).size).toBe(1);
  });
});

describe('a hostile member: signals naming other pairs', () => {
  it.each(KINDS)(
    "%s (links kept across rounds): signals for the link between two others reach neither end's link; no round fails; the run is the clean run",
    async (kind) => {
      const r = await run({
        kind,
        reuseLinks: true,
        timeoutMs: 4_000,
        deadlineMs: 8_000,
        mischief: { during: once(2, (h) => h.forgeSignals()) },
      });
      // The server relays them (a signal is only data): what matters is what the honest ranks do with them.
      expect(r.attempts.length).toBeGreaterThanOrEqual(3 * 2 * 3);
      expect(r.attempts.filter((a) => a.code !== null)).toEqual([]);
      expectTrainedOn(r, kind);
      for (const o of r.honest) {
        expect(o.forgedFed(), `forged signals fed to honest rank ${o.rank}'s links`).toBe(0);
        expect(o.generations, `honest rank ${o.rank}'s rounds`).toBe(1);
      }
      await expectCleanWeights(r, kind);
    },
  );

  it('ddp (a link per round): the group links take signals of their own pair from its attested rank only', async () => {
    const r = await run({ kind: 'ddp', timeoutMs: 4_000, deadlineMs: 8_000, mischief: { during: once(2, (h) => h.forgeSignals()) } });
    expectTrainedOn(r, 'ddp');
    for (const o of r.honest) expect(o.forgedFed(), `honest rank ${o.rank}`).toBe(0);
    await expectCleanWeights(r, 'ddp');
  });
});

describe('a hostile member: the run closed mid-run', () => {
  it.each(KINDS)(
    '%s: its close marks only itself done; the honest ranks are not told and train to the end, to the clean run',
    async (kind) => {
      const r = await run({ kind, mischief: { during: once(2, (h) => h.closeRendezvous()) } });
      expect(r.attempts.map((a) => a.code)).toEqual([null]);
      expectTrainedOn(r, kind);
      await expectCleanWeights(r, kind);
    },
  );

  it('ddp, elastic 3..4: it closes and leaves; the next round forms without it and the honest ranks train to the end', async () => {
    class Leaves extends Error {}
    const r = await run({
      kind: 'ddp',
      elastic: true,
      mischief: {
        during: once(2, async (h) => {
          const a = await h.closeRendezvous();
          // The tab closes: its runner ends, and its connection with it.
          throw Object.assign(new Leaves('the hostile tab closes'), { attempt: a });
        }),
      },
    });
    expect(r.hostile!.error).toBeInstanceOf(Leaves);
    for (const o of r.honest) {
      expect(o.error, `honest rank ${o.rank}`).toBeNull();
      expect(o.steps).toBe(STEPS);
      expect(o.stoppedBy).toBeNull();
      expect(o.closedHeard, `honest rank ${o.rank} heard the run was closed`).toBe(false);
      // Its leaving failed the round it was in; the next one is the honest ranks' alone.
      expect(o.failures.length, `honest rank ${o.rank}'s failed rounds`).toBeGreaterThan(0);
      expect(o.worlds.at(-1)).toBe(WORLD - 1);
    }
    expect(new Set(r.honest.map((o) => hash(o.weights))).size).toBe(1);
  });
});

describe('a hostile member: floods', () => {
  it("refused with named errors (UNKNOWN_PEER, BAD_MESSAGE, UNKNOWN_TYPE, NOT_JOINED, RATE_LIMITED, a socket closed past maxErrorsPerSocket); the session's honest ranks and another session train on", async () => {
    // Small budgets, so that the flood reaches them in a few requests.
    const srv = await withServer({
      settleMs: 300,
      limits: { maxFailedRegroupsPerMember: 2, regroupIntervalMs: 200, maxErrorsPerSocket: 40 },
      joinRate: { burst: WORLD + 2, perSecond: 0.01 },
    });
    try {
      let floodStarted!: () => void;
      const started = new Promise<void>((resolve) => (floodStarted = resolve));
      let report: FloodReport | undefined;
      const other = run({ kind: 'ddp', on: srv, holdAt: { step: 2, until: started } }).then((o) => o);
      const flooded = run({
        kind: 'ddp',
        on: srv,
        mischief: {
          during: once(2, async (h) => {
            floodStarted();
            report = await h.flood({
              signals: 30,
              hugeGathers: 5,
              unknownTypes: 5,
              failedRegroups: 4,
              extraBurst: 80,
              joins: 6,
              joinAs: { min: WORLD, max: WORLD },
            });
            return undefined;
          }),
        },
      });
      const [a, b] = await Promise.all([flooded, other]);
      const f = report!;
      expect(f.member.UNKNOWN_PEER).toBe(30);
      expect(f.member.BAD_MESSAGE).toBe(5);
      expect(f.member.UNKNOWN_TYPE).toBe(5);
      // Two regroups after a "failure" are this member's budget; the third is refused.
      expect(f.member.taken).toBe(2);
      expect(f.member.RATE_LIMITED).toBe(1);
      expect(f.memberOpen).toBe(true);
      // The extra socket: refused one by one, then closed after its 41st counted refusal.
      expect(f.extraClosedWith).toBe(4001);
      const refusedThenClosed = (f.extra.NOT_JOINED ?? 0) + (f.extra.BAD_MESSAGE ?? 0) + (f.extra.UNKNOWN_TYPE ?? 0);
      expect(refusedThenClosed).toBe(41);
      expect(f.extra['CLOSED 4001']).toBe(80 - 41);
      // Joins: the session's 4 and 2 more are the burst; then RATE_LIMITED.
      expect(f.joins).toEqual({ SESSION_FULL: 2, RATE_LIMITED: 1 });
      for (const o of a.honest) {
        expect(o.error, `honest rank ${o.rank}`).toBeNull();
        expect(o.steps).toBe(STEPS);
        expect(o.stoppedBy).toBeNull();
      }
      expect(new Set(a.ranks.map((o) => hash(o.weights))).size).toBe(1);
      // Another session on the same server trained through the flood, untouched.
      expectTrainedOn(b, 'ddp');
      expect(new Set(b.ranks.map((o) => hash(o.weights))).size).toBe(1);
      // And the flooded session's store still answers a fresh connection.
      const fresh = await StoreClient.connect(srv.url, {
        session: a.member!.client.session,
        token: tokenFor(a.member!.client.session),
        timeoutMs: 5_000,
      });
      await fresh.set('after-the-flood', 'ok');
      expect(new TextDecoder().decode(await fresh.get('after-the-flood'))).toBe('ok');
      fresh.close();
    } finally {
      await srv.close();
    }
  }, 60_000);
});

describe('a hostile member: NaN contributions', () => {
  const nan: Mischief = { spoil: { from: 3, attack: { kind: 'nan' } } };

  it('ddp, the mean: NonFiniteGradientError on every rank naming the parameter, nothing applied', async () => {
    const r = await run({ kind: 'ddp', mischief: nan });
    for (const o of r.ranks) {
      expect(o.error, `rank ${o.rank}`).toBeInstanceOf(NonFiniteGradientError);
      expect((o.error as Error).message).toMatch(/parameter/);
      expect(allFinite(await flatTrainableWeights(o.model!))).toBe(true);
    }
  });

  it('ddp, a trimmed mean: the hostile gradient is refused and judged so; the honest ranks train on, identical and finite', async () => {
    const r = await run({ kind: 'ddp', aggregation: { kind: 'trimmed-mean', trim: 1 }, mischief: nan });
    expectTrainedOn(r, 'ddp');
    for (const o of r.honest) expect(o.judged).toEqual(['used', 'used', 'refused', 'refused', 'refused', 'refused']);
    expect(new Set(r.ranks.map((o) => hash(o.weights))).size).toBe(1);
    expect(allFinite(r.honest[0]!.weights!)).toBe(true);
  });

  it('diloco, the mean: the outer step refuses it (NonFiniteWeightsError) on every rank, nothing applied', async () => {
    const r = await run({ kind: 'diloco', mischief: nan });
    for (const o of r.ranks) {
      expect(o.error, `rank ${o.rank}`).toBeInstanceOf(NonFiniteWeightsError);
      // Refused where the outer step computes the new outer weights, before anything is kept.
      expect((o.error as NonFiniteWeightsError).source).toBe("DiLoCo's outer step (the new outer weights)");
      if (!o.hostile) expect(allFinite(await flatTrainableWeights(o.model!))).toBe(true);
    }
  });

  it('diloco, a trimmed mean (elastic 3..4): the hostile pseudo-gradient is refused and judged so; the hostile rank fails on its own NaN weights and leaves; the honest ranks train on, identical and finite', async () => {
    const r = await run({ kind: 'diloco', elastic: true, aggregation: { kind: 'trimmed-mean', trim: 1 }, mischief: nan });
    // Its pseudo-gradient was NaN because its weights were: the outer step's merge keeps its own inner progress (NaN - NaN), which its own finiteness check refuses.
    expect(r.hostile!.error).toBeInstanceOf(NonFiniteWeightsError);
    for (const o of r.honest) {
      expect(o.error, `honest rank ${o.rank}`).toBeNull();
      expect(o.steps).toBe(STEPS);
      expect(o.judged, `honest rank ${o.rank}`).toContain('refused');
    }
    expect(new Set(r.honest.map((o) => hash(o.weights))).size).toBe(1);
    expect(allFinite(r.honest[0]!.weights!)).toBe(true);
  });

  it.each([
    [3, 'the last stage: NaN gradients to its replica and NaN activation gradients upstream'],
    [2, 'the first stage: NaN gradients to its replica and NaN activations downstream'],
  ])(
    "pipeline, hostile rank %i, %s: nothing checks them at the stage boundary; DDP refuses the stage's NaN gradients (NonFiniteGradientError) and no rank applies them",
    async (hostileRank) => {
      // The first stage's ranks wait for activation gradients the last stage never sends (it failed
      // first) and then for the group to be whole again: they end with the runner's timeout.
      const r = await run({ kind: 'pipeline', hostileRank, mischief: nan, timeoutMs: 2_000 });
      for (const o of r.ranks) {
        const stage = o.rank % 2;
        expect(o.error, `rank ${o.rank} (stage ${stage})`).toBeInstanceOf(stage === 1 ? NonFiniteGradientError : Error);
        expect(allFinite(await flatTrainableWeights(o.model!)), `rank ${o.rank}'s weights`).toBe(true);
      }
      // The clean replica's last stage is refused by its all-reduce with the hostile replica's: the NaN never lands.
      expect((r.ranks[1]!.error as Error).message).toMatch(/is not finite .*the update was not applied/);
    },
  );

  it('parameter server (CentralStorage): the accumulator refuses a NaN push (the worker counts it refused); its next push completes the step, and the run is the clean run', async () => {
    let nanSteps = 0;
    const r = await run({
      kind: 'ps',
      mischief: {
        // NaN once: it computes its step again after the refusal, honestly.
        during: async (_h, step) => void (step === 2 && nanSteps++),
        spoil: { from: 2, attack: { kind: 'nan' } },
        spoilOnce: true,
      },
    });
    expectTrainedOn(r, 'ps');
    expect(nanSteps).toBe(1);
    expect(r.hostile!.ps!.worker!.refused).toBe(1);
    await expectCleanWeights(r, 'ps');
  });

  it('parameter server (async): the shard refuses the hostile pushes (nonfinite, counted) and the workers train on', async () => {
    const r = await run({ kind: 'ps', strategy: 'async', mischief: { spoil: { from: 1, attack: { kind: 'nan' } } } });
    for (const o of r.honest) expect(o.error, `honest rank ${o.rank}`).toBeNull();
    const shard = r.ranks.find((o) => o.ps?.role === 'server')!;
    expect(shard.hostile).toBe(false);
    expect(shard.ps!.shard!.refusedBy.nonfinite).toBeGreaterThan(0);
    expect(r.hostile!.ps!.worker!.refused).toBe(shard.ps!.shard!.refusedBy.nonfinite);
    expect(r.hostile!.ps!.worker!.applied).toBe(0);
    for (const o of r.ranks) expect(allFinite(o.weights!)).toBe(true);
    expect(new Set(r.ranks.map((o) => hash(o.weights))).size).toBe(1);
  });
});

describe('a hostile member: gradients x1000', () => {
  const scaled: Mischief = { spoil: { from: 1, attack: { kind: 'scale', factor: 1000 } } };

  it.each(['ddp', 'diloco'] as const)(
    '%s: the mean moves far off the clean run; a trimmed mean and centered clipping stay near it, every rank alike',
    async (kind) => {
      const c = await clean(kind);
      const init = await flatTrainableWeights(mlp());
      const cleanW = c.ranks[0]!.weights!;
      const progress = distance(cleanW, init);
      const figures: Record<string, number> = {};
      for (const aggregation of [
        { kind: 'mean' },
        { kind: 'trimmed-mean', trim: 1 },
        { kind: 'centered-clip', tau: 'auto', iterations: 3 },
      ] as AggregationSpec[]) {
        const r = await run({ kind, aggregation, mischief: scaled });
        expectTrainedOn(r, kind);
        // Whatever the rule, every rank applied the same: the replicas are identical.
        expect(new Set(r.ranks.map((o) => hash(o.weights))).size, aggregation.kind).toBe(1);
        figures[aggregation.kind] = distance(r.honest[0]!.weights!, cleanW) / progress;
      }
      console.log(`${kind}: distance from the clean run / its progress, one rank x1000`, figures);
      expect(figures.mean!).toBeGreaterThan(1);
      expect(figures['trimmed-mean']!).toBeLessThan(0.5);
      expect(figures['centered-clip']!).toBeLessThan(0.5);
    },
    30_000,
  );
});
