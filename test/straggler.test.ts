/**
 * Stragglers on demand (--slow RANK:FACTOR): the spec as the launcher, the train job and the
 * script pages read it; the Straggler's waits; and, on in-memory ranks, that a straggler's wait
 * holds the others' all-reduce (DDP) and its neighbours (a pipeline stage), as a slower device would.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { refusalLine } from './fixtures/launch_cli.ts';
import type { RunningServer } from '../signaling/server.ts';
import { Straggler, StragglerSpecError, formatSlow, parseSlow, slowFactor } from '../src/runtime/straggler.ts';
import { launch } from '../launcher/run.ts';
import { largestWorld, slowParam } from '../launcher/job_flags.ts';
import { stragglers } from '../launcher/summaries.ts';
import { configParams } from '../src/jobs/train_config.ts';
import { parse, refusal } from './fixtures/train_config.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { classificationLoss, sequentialOf } from '../src/nn/models.ts';
import { PipelineStage } from '../src/parallel/pipeline/stage.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { watchCollectiveFrames } from './fixtures/links.ts';

const problem = (spec: string, world?: number): string => {
  try {
    parseSlow(spec, world);
  } catch (err) {
    expect(err).toBeInstanceOf(StragglerSpecError);
    expect((err as StragglerSpecError).spec).toBe(spec);
    return (err as StragglerSpecError).problem;
  }
  throw new Error(`"${spec}" was accepted`);
};

describe('parseSlow: RANK:FACTOR[,RANK:FACTOR...]', () => {
  it('reads ranks and factors, integers or not, spaces around items allowed; empty is none', () => {
    expect(parseSlow('3:4')).toEqual({ 3: 4 });
    expect(parseSlow('1:2.5,3:4', 4)).toEqual({ 1: 2.5, 3: 4 });
    expect(parseSlow(' 0 : 1 , 2:1.25 ')).toEqual({ 0: 1, 2: 1.25 });
    expect(parseSlow('')).toEqual({});
  });

  it('writes back what it reads, ranks in order', () => {
    expect(formatSlow(parseSlow('3:4,1:2.5'))).toBe('1:2.5,3:4');
    expect(parseSlow(formatSlow({ 0: 1.5, 7: 10 }))).toEqual({ 0: 1.5, 7: 10 });
  });

  it('names what is wrong: the syntax, a factor below 1 or not finite, a rank out of range or given twice', () => {
    expect(problem('3')).toBe('"3" is not RANK:FACTOR (e.g. 3:4)');
    expect(problem('3:')).toBe('"3:" is not RANK:FACTOR (e.g. 3:4)');
    expect(problem(':4')).toBe('":4" is not RANK:FACTOR (e.g. 3:4)');
    expect(problem('1:2:3')).toBe('"1:2:3" is not RANK:FACTOR (e.g. 3:4)');
    expect(problem('1:2,,3:4')).toMatch(/^an empty item/);
    expect(problem('a:4')).toBe('"a:4": RANK "a" is not an integer of at least 0');
    expect(problem('-1:4')).toBe('"-1:4": RANK "-1" is not an integer of at least 0');
    expect(problem('1.5:4')).toBe('"1.5:4": RANK "1.5" is not an integer of at least 0');
    expect(problem('3:x')).toBe('"3:x": FACTOR "x" is not a number');
    expect(problem('3:0x10')).toBe('"3:0x10": FACTOR "0x10" is not a number');
    for (const f of ['0.5', '0', '-2'])
      expect(problem(`3:${f}`)).toBe(`"3:${f}": FACTOR must be at least 1 (1 is full speed, 4 four times slower)`);
    for (const f of ['Infinity', '1e999']) expect(problem(`3:${f}`)).toBe(`"3:${f}": FACTOR must be finite`);
    expect(problem('4:2', 4)).toBe('"4:2": RANK 4 is out of range: the world has 4 rank(s), 0 to 3');
    expect(problem('1:2,3:4,1:3')).toBe('rank 1 is given twice ("1:2" and "1:3")');
  });

  it("a rank's factor is 1 when the spec leaves it out", () => {
    expect(slowFactor({ 3: 4 }, 3)).toBe(4);
    expect(slowFactor({ 3: 4 }, 0)).toBe(1);
    expect(slowFactor(null, 0)).toBe(1);
  });
});

describe('Straggler', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('waits (factor - 1) x the compute it is told of, and says how long', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'performance'] });
    const s = new Straggler(3);
    let waited: number | undefined;
    void s.after(20).then((ms) => (waited = ms));
    await vi.advanceTimersByTimeAsync(39);
    expect(waited).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1);
    expect(waited).toBe(40);
    const half = new Straggler(2.5);
    const p = half.after(10);
    await vi.advanceTimersByTimeAsync(15);
    expect(await p).toBe(15);
  });

  it('a factor of 1 never waits, nor does no compute', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'performance'] });
    const s = new Straggler(1);
    expect(s.slow).toBe(false);
    expect(await s.after(1000)).toBe(0);
    expect(await new Straggler(4).after(0)).toBe(0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('repays a timer that fired late by waiting less the next time', async () => {
    // A 0.1 ms timer that fires 1 ms later (browsers clamp short timers): the next 0.1 ms owed
    // is already paid. The clock is scripted; a real timer's lateness varies from machine to machine.
    const clock = [0, 1];
    const now = vi.spyOn(performance, 'now').mockImplementation(() => clock.shift() ?? 1);
    try {
      const s = new Straggler(2);
      expect(await s.after(0.1)).toBe(1);
      expect(await s.after(0.1)).toBe(0);
      expect(await s.after(0.8)).toBe(0);
    } finally {
      now.mockRestore();
    }
  });

  it('caps that credit: a timer seconds late (a throttled tab) buys at most 100 ms of full speed', async () => {
    const clock = [0, 5000, 5000, 5010];
    const now = vi.spyOn(performance, 'now').mockImplementation(() => clock.shift() ?? 5010);
    try {
      const s = new Straggler(2);
      expect(await s.after(1)).toBe(5000);
      expect(await s.after(50)).toBe(0);
      expect(await s.after(60)).toBe(10);
    } finally {
      now.mockRestore();
    }
  });

  it('refuses a factor below 1 or not finite', () => {
    for (const f of [0.5, 0, -1, Number.NaN, Number.POSITIVE_INFINITY]) expect(() => new Straggler(f)).toThrow(RangeError);
  });
});

describe('the launcher: --slow RANK:FACTOR, repeatable or comma-separated', () => {
  it('joins every value into one spec for the pages, checked against the largest world', () => {
    expect(slowParam(['3:4'], 4)).toBe('3:4');
    expect(slowParam(['3:4', '1:2.5'], 4)).toBe('1:2.5,3:4');
    expect(slowParam(['0:2,1:3', '2:4'], 3)).toBe('0:2,1:3,2:4');
    expect(largestWorld({}, { nproc: 2, nnodes: 2 })).toBe(4);
    expect(largestWorld({ min: '2', max: '6' }, { nproc: 4 })).toBe(6);
    expect(largestWorld({ max: '2' }, { nproc: 4 })).toBe(4);
  });

  it('refuses with a message that starts with the flag and says how it goes', () => {
    const refusal = (values: string[], world = 4) => {
      try {
        slowParam(values, world);
      } catch (err) {
        return (err as Error).message;
      }
      throw new Error(`${values.join(' ')} was accepted`);
    };
    const how = 'it takes RANK:FACTOR, repeated or comma-separated (e.g. --slow 3:4 or --slow 1:2.5,3:4), FACTOR >= 1 times slower';
    expect(refusal(['true'])).toBe(`--slow needs a value: ${how}`);
    expect(refusal(['3-4'])).toBe(`--slow "3-4" is not RANK:FACTOR (e.g. 3:4): ${how}`);
    expect(refusal(['3:0.5'])).toMatch(/^--slow "3:0.5": FACTOR must be at least 1/);
    expect(refusal(['3:1e999'])).toMatch(/^--slow "3:1e999": FACTOR must be finite/);
    expect(refusal(['4:2'])).toMatch(/^--slow "4:2": RANK 4 is out of range: the world has 4 rank\(s\), 0 to 3/);
    expect(refusal(['1:2', '1:3'])).toMatch(/^--slow rank 1 is given twice/);
  });

  // What the command line prints before it exits 2 (test/fixtures/launch_cli.ts; rank_browsers runs the real command).
  it('npm run launch refuses it before starting anything, saying what to give', () => {
    expect(refusalLine('--nproc', '2', '--job', 'train', '--slow', '1:2', '--slow', '2:4')).toMatch(
      /^--slow "2:4": RANK 2 is out of range: the world has 2 rank\(s\), 0 to 1/,
    );
  });

  it('is for the train job and scripts only, and launch() checks it too', async () => {
    const opts = { nproc: 2, session: 's', timeoutSec: 1, jobParams: { slow: '1:2' } };
    await expect(launch({ ...opts, job: 'allreduce' })).rejects.toThrow('--slow is for --job train and scripts, not --job allreduce');
    await expect(launch({ ...opts, job: 'train', jobParams: { slow: '2:2' } })).rejects.toThrow(/^--slow "2:2": RANK 2 is out of range/);
  });

  it("the run's summary lists the slowed ranks, their factors and waits", () => {
    expect(stragglers([{ rank: 0, worldSize: 2 }])).toEqual({});
    expect(
      stragglers([
        { rank: 0, slowFactor: 1, slowedMs: 0 },
        { rank: 1, slowFactor: 4, slowedMs: 30.123 },
      ]),
    ).toEqual({ stragglers: [{ rank: 1, slowFactor: 4, slowedMs: 30.12 }] });
  });
});

describe('the train job: option slow', () => {
  it("reads the launcher's spec, is null unless given, and a link keeps it", () => {
    expect(parse('world=4').slow).toBeNull();
    expect(parse('world=4&slow=').slow).toBeNull();
    expect(parse('world=4&slow=3:4').slow).toEqual({ 3: 4 });
    // An elastic session numbers ranks up to its largest size.
    expect(parse('world=2&max=4&slow=1:2.5,3:4').slow).toEqual({ 1: 2.5, 3: 4 });
    const config = parse('world=4&pp=2&dp=2&slow=2:3');
    expect(configParams(config).get('slow')).toBe('2:3');
    expect(parse(configParams(config).toString())).toEqual(config);
  });

  it('refuses a bad spec with a ConfigError naming the option and what is wrong', () => {
    expect(refusal('world=4&slow=abc')).toMatchObject({ name: 'ConfigError', option: 'slow', value: 'abc' });
    expect(refusal('world=4&slow=abc').message).toBe(
      'option slow must be RANK:FACTOR items separated by commas (e.g. 3:4 or 1:2.5,3:4), got "abc"',
    );
    const far = refusal('world=4&slow=4:2');
    expect(far).toMatchObject({ option: 'slow', value: '4:2' });
    expect(far.message).toMatch(/RANK from 0 to 3 .*"4:2": RANK 4 is out of range/);
    expect(refusal('world=4&slow=1:0.5').message).toMatch(/"1:0.5": FACTOR must be at least 1/);
    expect(refusal('world=4&slow=1:1e999').message).toMatch(/"1:1e999": FACTOR must be finite/);
    expect(refusal('world=4&slow=1:2,1:3').message).toMatch(/rank 1 is given twice/);
  });
});

describe('on in-memory ranks (TF.js cpu)', () => {
  let server: RunningServer;
  beforeAll(async () => {
    await tf.setBackend('cpu');
    server = await withServer();
  });
  afterAll(async () => {
    await server.close();
  });

  async function groups(n: number, net = new MemoryNetwork()): Promise<ProcessGroup[]> {
    const session = uniqueSession('slow');
    return Promise.all(
      Array.from({ length: n }, (_, rank) =>
        initProcessGroup({
          url: server.url,
          session,
          token: tokenFor(session),
          worldSize: n,
          rank,
          timeoutMs: 5_000,
          linkFactory: net.factoryFor(rank),
        }),
      ),
    );
  }

  const layers = () =>
    [8, 4].map(
      (units, i) => (inputShape?: number[]) =>
        tf.layers.dense({
          units,
          kernelInitializer: tf.initializers.glorotUniform({ seed: 5 + i }),
          ...(inputShape ? { inputShape } : {}),
        }),
    );

  /** A straggler whose waits the test releases: it records what it was told and returns 7 ms a call. */
  function gated() {
    const told: number[] = [];
    let open: () => void = () => {};
    const gate = new Promise<void>((r) => (open = r));
    return {
      told,
      open: () => open(),
      straggler: {
        after: async (ms: number) => {
          told.push(ms);
          await gate;
          return 7;
        },
      },
    };
  }

  it("DDP: the straggler's wait comes before its all-reduce, so the other rank's backward waits for it", async () => {
    const net = new MemoryNetwork();
    const pgs = await groups(2, net);
    const ddps = await Promise.all(pgs.map((pg) => DistributedDataParallel.create(sequentialOf(layers(), [6], `m${pg.rank}`), pg)));
    const [fromFast, fromSlow] = [watchCollectiveFrames(net.end(0, 1)!), watchCollectiveFrames(net.end(1, 0)!)];
    const slow = gated();
    const backward = (d: DistributedDataParallel, options = {}) => {
      const xs = tf.ones([4, 6]);
      const ys = tf.tensor1d([0, 1, 2, 3], 'int32');
      return d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4), options).finally(() => tf.dispose([xs, ys]));
    };
    let fastDone = false;
    const fast = backward(ddps[0]!).then((r) => {
      fastDone = true;
      return r;
    });
    const slowed = backward(ddps[1]!, { straggler: slow.straggler });
    await vi.waitFor(() => expect(slow.told.length).toBe(1));
    // The fast rank is in its all-reduce, and the held rank has sent it nothing: it can only wait.
    await waitFor("the fast rank's all-reduce to send", () => fromFast.sent > 0);
    expect(fromSlow.sent).toBe(0);
    expect(fastDone).toBe(false);
    slow.open();
    const [f, s] = await Promise.all([fast, slowed]);
    // One bucket: one wait, told the forward, backward and readback together.
    expect(slow.told[0]).toBeCloseTo(s.timings.compute + s.timings.readback, 6);
    expect(s.timings.slowed).toBe(7);
    expect(f.timings.slowed).toBe(0);
    for (const d of ddps) d.model.dispose();
    for (const pg of pgs) pg.destroy();
  });

  it('a pipeline stage: the straggler waits after each pass, before sending on; its waits are its own', async () => {
    const pgs = await groups(2);
    const stages = pgs.map((pg) => new PipelineStage({ layers: layers(), inputShape: [6], group: pg }));
    const ddps = await Promise.all(stages.map(async (st) => DistributedDataParallel.create(st.model, await groups1(st))));
    const slow = {
      told: [] as number[],
      straggler: {
        after: async (ms: number) => {
          slow.told.push(ms);
          return 7;
        },
      },
    };
    const inputs = new Float32Array(4 * 6).fill(1);
    const labels = Int32Array.from([0, 1, 2, 3]);
    const loss = (out: tf.Tensor, y: tf.Tensor) => classificationLoss(out, y, 4);
    const [first, last] = await Promise.all(
      stages.map((st, s) =>
        st.step({
          ddp: ddps[s]!,
          batchSize: 4,
          microBatches: 2,
          ...(st.isFirst ? { inputs, straggler: slow.straggler } : { labels, loss }),
        }),
      ),
    );
    // Stage 0 of 2 micro-batches: two forwards, two backwards (one bucket each, no input gradient to send).
    expect(slow.told).toHaveLength(4);
    expect(slow.told.reduce((a, b) => a + b, 0)).toBeCloseTo(first!.timings.compute, 6);
    expect(first!.timings.slowed).toBe(28);
    expect(last!.timings.slowed).toBe(0);
    for (const st of stages) st.model.dispose();
    for (const pg of pgs) pg.destroy();
  });

  /** A stage's data-parallel group: one rank of its own (no replicas). */
  async function groups1(st: PipelineStage): Promise<ProcessGroup> {
    const session = uniqueSession(`slow-dp${st.stage}`);
    return initProcessGroup({
      url: server.url,
      session,
      token: tokenFor(session),
      worldSize: 1,
      rank: 0,
      timeoutMs: 5_000,
      linkFactory: new MemoryNetwork().factoryFor(0),
    });
  }
});
