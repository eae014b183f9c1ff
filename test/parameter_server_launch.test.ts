/**
 * The launcher and a parameter-server run (--job train --strategy ps|central): its flags are
 * checked against each other and the world before anything starts (the pure checks in
 * launcher/run.ts, and the command line's exit code 2), the run is elastic by default (--min
 * K + 1), the membership faults are allowed, and the summary gathers the ranks' `parameterServer`
 * parts into one `parameterServer` and a few printed lines.
 */
import { describe, expect, it } from 'vitest';
import { refusalLine, refusalOf } from './fixtures/launch_cli.ts';
import { launch, type Fault } from '../launcher/run.ts';
import {
  membershipFaultProblem,
  parameterServerFlagsFor,
  parameterServerParams,
  parameterServerProblems,
  parameterServerRun,
} from '../launcher/job_flags.ts';
import { summarize } from '../launcher/summaries.ts';
import type { RankResult } from '../launcher/summary_fields.ts';
import { parameterServerLines, parameterServerSummary } from '../launcher/summary_ps.ts';

describe('parameterServerProblems', () => {
  it('accepts K servers and at least one worker, in kebab or camel case', () => {
    expect(parameterServerProblems({ strategy: 'ps', ps: '2' }, { nproc: 3 })).toEqual([]);
    expect(parameterServerProblems({ strategy: 'ps' }, { nproc: 2 })).toEqual([]);
    expect(parameterServerProblems({ strategy: 'ps', ps: '2', 'max-staleness': '0', 'staleness-lr': 'true' }, { nproc: 4 })).toEqual([]);
    expect(parameterServerProblems({ strategy: 'ps', maxStaleness: '3', stalenessLr: 'true' }, { nproc: 4 })).toEqual([]);
    expect(parameterServerProblems({ strategy: 'central' }, { nproc: 2 })).toEqual([]);
    expect(parameterServerProblems({ strategy: 'central', ps: '1' }, { nproc: 2 })).toEqual([]);
    // Two machines of 2 ranks: 3 servers and a worker.
    expect(parameterServerProblems({ strategy: 'ps', ps: '3' }, { nproc: 2, nnodes: 2 })).toEqual([]);
    // No PS flags, or an explicit ddp: nothing to say.
    expect(parameterServerProblems({ min: '1', max: '4' }, { nproc: 1 })).toEqual([]);
    expect(parameterServerProblems({ strategy: 'ddp', ps: '1', 'staleness-lr': 'false' }, { nproc: 1 })).toEqual([]);
    // --slow is not a PS flag: it works with every strategy.
    expect(parameterServerProblems({ strategy: 'ps', slow: '2:3' }, { nproc: 3 })).toEqual([]);
  });

  it('leaves a worker: --nproc, --min and --max at least K + 1', () => {
    expect(parameterServerProblems({ strategy: 'ps', ps: '2' }, { nproc: 2 })).toEqual([
      '--nproc 2 with --ps 2 leaves no worker: give --nproc at least 3',
    ]);
    expect(parameterServerProblems({ strategy: 'ps' }, { nproc: 1 })).toEqual([
      '--nproc 1 with --strategy ps (one server: --ps defaults to 1) leaves no worker: give --nproc at least 2',
    ]);
    expect(parameterServerProblems({ strategy: 'central' }, { nproc: 1 })).toEqual([
      '--nproc 1 with --strategy central (one server) leaves no worker: give --nproc at least 2',
    ]);
    expect(parameterServerProblems({ strategy: 'ps', ps: '4' }, { nproc: 2, nnodes: 2 })).toEqual([
      '--nnodes 2 x --nproc 2 = 4 ranks with --ps 4 leaves no worker: give --nproc at least 3',
    ]);
    expect(parameterServerProblems({ strategy: 'ps', ps: '2', min: '2' }, { nproc: 4 })).toEqual([
      '--min 2 with --ps 2 leaves no worker in a world that small: give --min at least 3 (the servers and a worker), or leave it out (3 by default)',
    ]);
    expect(parameterServerProblems({ strategy: 'ps', min: '3', max: '5' }, { nproc: 4 })).toEqual([]);
  });

  it('wants --ps a positive integer, --max-staleness an integer >= 0, --staleness-lr no value, --strategy a known one', () => {
    // The schema's rules (and bounds), phrased as the flags.
    for (const bad of ['0', '-1', '1.5', 'two', 'true', '', '64']) {
      expect(parameterServerProblems({ strategy: 'ps', ps: bad }, { nproc: 3 })).toEqual([
        `--ps must be an integer from 1 to 63 (the number of parameter-server ranks), got "${bad}"`,
      ]);
    }
    expect(parameterServerProblems({ strategy: 'ps', 'max-staleness': '-1' }, { nproc: 3 })).toEqual([
      '--max-staleness must be an integer from 0 to 1000000 (the most updates a push may be behind), got "-1"',
    ]);
    expect(parameterServerProblems({ strategy: 'ps', 'staleness-lr': 'yes' }, { nproc: 3 })).toEqual([
      '--staleness-lr takes no value (or true or false), got "yes"',
    ]);
    expect(parameterServerProblems({ strategy: 'async' }, { nproc: 3 })).toEqual([
      '--strategy must be one of ddp, ps, central (ps: asynchronous parameter servers, central: one server, synchronous), got "async"',
    ]);
  });

  it('--ps needs --strategy ps; central keeps one server; the staleness flags are for ps', () => {
    expect(parameterServerProblems({ ps: '2' }, { nproc: 3 })).toEqual([
      '--ps 2 needs --strategy ps: parameter servers are a strategy of their own (add --strategy ps)',
    ]);
    expect(parameterServerProblems({ strategy: 'central', ps: '2' }, { nproc: 3 })).toEqual([
      '--strategy central keeps every variable on one server: --ps must be 1 (for several servers, use --strategy ps)',
    ]);
    expect(parameterServerProblems({ 'max-staleness': '2', 'staleness-lr': 'true' }, { nproc: 3 })).toEqual([
      '--max-staleness and --staleness-lr are for asynchronous parameter servers: add --strategy ps (and --ps K)',
    ]);
    expect(parameterServerProblems({ strategy: 'central', maxStaleness: '2' }, { nproc: 3 })).toEqual([
      '--maxStaleness is for --strategy ps: --strategy central is synchronous, its pushes are never stale',
    ]);
  });

  it('a PS strategy does not combine with --pp or --dp', () => {
    expect(parameterServerProblems({ strategy: 'ps', pp: '2' }, { nproc: 2 })).toEqual([
      '--strategy ps does not combine with --pp 2: a pipeline splits the model between ranks while parameter servers hold all of it; drop --pp or --strategy ps',
    ]);
    expect(parameterServerProblems({ strategy: 'central', pp: '2', dp: '2' }, { nproc: 4 })).toHaveLength(2);
    expect(parameterServerProblems({ strategy: 'ps', pp: '1' }, { nproc: 2 })).toEqual([]);
  });
});

describe('a PS run is elastic by default and takes the membership faults', () => {
  it('gets --min K + 1 unless --min is given; other runs are left as they are', () => {
    expect(parameterServerParams({ strategy: 'ps', ps: '2' })).toEqual({ strategy: 'ps', ps: '2', min: '3' });
    expect(parameterServerParams({ strategy: 'central' })).toEqual({ strategy: 'central', min: '2' });
    expect(parameterServerParams({ strategy: 'ps', min: '4' })).toEqual({ strategy: 'ps', min: '4' });
    expect(parameterServerParams({ dataset: 'synthetic' })).toEqual({ dataset: 'synthetic' });
    expect(parameterServerRun({ strategy: 'ps', ps: '3' })).toEqual({ strategy: 'ps', servers: 3 });
    expect(parameterServerRun({ strategy: 'ddp' })).toBeNull();
  });

  it('--kill, --freeze and --join: allowed for PS runs, refused for a fixed-size DDP run', () => {
    const faults: Fault[] = [
      { kind: 'kill', rank: 2, step: 5 },
      { kind: 'freeze', rank: 3, step: 8 },
      { kind: 'join', count: 1, step: 10 },
    ];
    expect(membershipFaultProblem(faults, { strategy: 'ps', ps: '2' }, true)).toBeUndefined();
    expect(membershipFaultProblem(faults, { strategy: 'central' }, true)).toBeUndefined();
    expect(membershipFaultProblem(faults, { min: '2' }, true)).toBeUndefined();
    expect(membershipFaultProblem(faults, { pp: '2' }, true)).toBeUndefined();
    expect(membershipFaultProblem(faults, {}, true)).toMatch(
      /^--kill, --freeze and --join need an elastic run .* or a parameter-server run/,
    );
    // --strategy is the train job's: another job with it is not elastic.
    expect(membershipFaultProblem(faults, { strategy: 'ps' }, false)).toMatch(/^--kill/);
    expect(membershipFaultProblem([{ kind: 'lose-device', rank: 1, step: 3 }], {}, true)).toBeUndefined();
  });

  it('the PS flags are the train job’s', () => {
    expect(parameterServerFlagsFor('train', { strategy: 'ps' })).toEqual([]);
    expect(parameterServerFlagsFor('allreduce', { strategy: 'ps', 'max-staleness': '2' })).toEqual(['--strategy', '--max-staleness']);
  });

  it('launch() checks them too, before anything starts', async () => {
    const opts = { session: 's', timeoutSec: 1 };
    await expect(launch({ ...opts, nproc: 2, job: 'train', jobParams: { strategy: 'ps', ps: '2' } })).rejects.toThrow(
      '--nproc 2 with --ps 2 leaves no worker: give --nproc at least 3',
    );
    await expect(launch({ ...opts, nproc: 2, job: 'allreduce', jobParams: { strategy: 'ps' } })).rejects.toThrow(
      '--strategy is for --job train, not --job allreduce',
    );
  });
});

describe('npm run launch -- --job train --strategy ...', () => {
  // What the command line prints before it exits 2 (test/fixtures/launch_cli.ts; rank_browsers runs the real command).
  it('refuses the command line before starting anything, saying what to give', () => {
    const few = refusalOf('--nproc', '2', '--job', 'train', '--strategy', 'ps', '--ps', '2');
    expect(few.split('\n')[0]).toBe('--nproc 2 with --ps 2 leaves no worker: give --nproc at least 3');
    expect(few).toMatch(/--ps K \(with --strategy ps/);
    expect(refusalLine('--nproc', '3', '--job', 'train', '--strategy', 'central', '--ps', '2')).toBe(
      '--strategy central keeps every variable on one server: --ps must be 1 (for several servers, use --strategy ps)',
    );
    // --staleness-lr takes no value; with ddp it is refused, and a pipeline with --strategy names both.
    expect(refusalLine('--nproc', '3', '--job', 'train', '--staleness-lr', '--pp', '3')).toBe(
      '--staleness-lr is for asynchronous parameter servers: add --strategy ps (and --ps K)',
    );
    expect(refusalLine('--nproc', '4', '--job', 'train', '--strategy', 'ps', '--pp', '2', '--dp', '2')).toMatch(
      /^--strategy ps does not combine with --pp 2/,
    );
  });
});

/** A rank's `parameterServer` part as the runtime reports it (2 servers on ranks 0 and 1, workers on 2 and 3). */
function psPart(rank: number, over: Record<string, unknown> = {}): Record<string, unknown> {
  const server = rank < 2;
  return {
    strategy: 'async',
    role: server ? 'server' : 'worker',
    index: server ? rank : rank - 2,
    servers: [
      { index: 0, rank: 0, parameters: [0, 1], numel: 100_480 },
      { index: 1, rank: 1, parameters: [2, 3], numel: 1_290 },
    ],
    workers: 2,
    versions: [310, 305],
    updatesPerSec: 41.237,
    samples: { target: 20_000, leased: 19_968, applied: 19_712, stale: 128, refused: 0, lost: 64, epoch: 0 },
    pushes: server ? { applied: 308 - rank, stale: 2, duplicate: rank, refused: 0 } : { applied: 154, stale: 1, duplicate: 0, refused: 0 },
    staleness: { histogram: [100, 150, 50, 8, 2], mean: 1.23456, p50: 1, p90: 2, max: 4 },
    maxStaleness: 4,
    stalenessLr: true,
    checkpoints: server ? 3 : 0,
    restoredFrom: null,
    ...(server ? {} : { worker: { workerId: rank - 2, pulls: 160, pushes: 155, samples: 9_920, samplesPerSec: 400.456 + rank } }),
    ...over,
  };
}

function result(rank: number, over: Record<string, unknown> = {}, psOver: Record<string, unknown> = {}): RankResult {
  return {
    rank,
    worldSize: 4,
    backend: 'webgpu',
    model: 'mlp',
    dataset: 'mnist',
    steps: 310,
    epochs: 1,
    samplesPerSec: rank < 2 ? null : 400,
    samplesPerSecWall: 350.5,
    finalLoss: rank < 2 ? null : 0.31,
    testAccuracy: rank < 2 ? null : 0.93,
    weightHash: `hash${rank}`,
    seconds: 25 + rank,
    parameterServer: psPart(rank, psOver),
    ...over,
  };
}

describe('a parameter-server run in the summary', () => {
  it('gathers the layout, versions and rate, server 0’s samples and staleness, each server’s own pushes and each worker’s samples/s', () => {
    const s = summarize('train', 4, [result(3), result(1), result(0), result(2)]);
    // Samples processed over the whole training time: every rank reports the same.
    expect(s.samplesPerSecWall).toBe(350.5);
    expect(s.parameterServer).toEqual({
      strategy: 'async',
      servers: [
        {
          index: 0,
          rank: 0,
          numel: 100_480,
          parameters: [0, 1],
          version: 310,
          pushes: { applied: 308, stale: 2, duplicate: 0, refused: 0 },
          checkpoints: 3,
          restoredFrom: null,
        },
        {
          index: 1,
          rank: 1,
          numel: 1_290,
          parameters: [2, 3],
          version: 305,
          pushes: { applied: 307, stale: 2, duplicate: 1, refused: 0 },
          checkpoints: 3,
          restoredFrom: null,
        },
      ],
      workers: 2,
      versions: [310, 305],
      updatesPerSec: 41.24,
      samples: { target: 20_000, leased: 19_968, applied: 19_712, stale: 128, refused: 0, lost: 64, epoch: 0 },
      staleness: { histogram: [100, 150, 50, 8, 2], mean: 1.23, p50: 1, p90: 2, max: 4 },
      maxStaleness: 4,
      stalenessLr: true,
      workerSamplesPerSec: [
        { workerId: 0, rank: 2, samples: 9_920, samplesPerSec: 402.46 },
        { workerId: 1, rank: 3, samples: 9_920, samplesPerSec: 403.46 },
      ],
    });
    // Rank 0 is a server here: the loss and accuracy come from the lowest rank that has them.
    expect(s).toMatchObject({ finalLoss: 0.31, testAccuracy: 0.93 });
  });

  it('prints a compact block: strategy, servers, versions, updates/s, samples, staleness, each worker’s samples/s', () => {
    const ps = parameterServerSummary([result(0), result(1), result(2), result(3)])!;
    expect(parameterServerLines(ps)).toEqual([
      'parameter servers: strategy async, 2 servers, 2 workers in the last round; max staleness 4, gradients scaled by 1/(1 + staleness)',
      '  servers: 0 on rank 0 (100480 elements, version 310); 1 on rank 1 (1290 elements, version 305)',
      '  updates/s (server 0): 41.24',
      '  samples (server 0): 19712 applied, 128 stale, 0 refused, 64 lost of 20000',
      '  staleness (server 0): mean 1.23, p50 1, p90 2, max 4',
      '  samples/s per worker: worker 0 (rank 2) 402.46, worker 1 (rank 3) 403.46',
    ]);
  });

  it('says n/a for what is missing: server 0 not reporting, a worker without a rate, a null staleness', () => {
    const ps = parameterServerSummary([
      result(
        1,
        {},
        {
          staleness: { histogram: [], mean: null, p50: null, p90: null, max: null },
          updatesPerSec: null,
          maxStaleness: null,
          stalenessLr: false,
        },
      ),
      result(2, {}, { worker: { workerId: 0, pulls: 1, pushes: 1, samples: 64, samplesPerSec: null } }),
    ])!;
    expect(ps.samples).toBeNull();
    expect(ps.staleness).toBeNull();
    expect(ps.servers.map((s) => s.pushes === null)).toEqual([true, false]);
    const lines = parameterServerLines(ps);
    expect(lines[0]).toBe('parameter servers: strategy async, 2 servers, 2 workers in the last round');
    expect(lines.slice(2)).toEqual([
      '  updates/s (server 0): n/a',
      '  samples (server 0): n/a',
      '  staleness (server 0): n/a',
      '  samples/s per worker: worker 0 (rank 2) n/a',
    ]);
  });

  it('is absent when no rank reports one, and a malformed part is not believed', () => {
    const ddp = summarize('train', 2, [
      { rank: 0, worldSize: 2, steps: 10, breakdownMs: { compute: 1 }, seconds: 3, weightHash: 'a' },
      { rank: 1, worldSize: 2, steps: 10, breakdownMs: { compute: 1 }, seconds: 3, weightHash: 'a' },
    ]);
    expect(ddp.parameterServer).toBeUndefined();
    expect(
      parameterServerSummary([
        result(0, { parameterServer: 'yes' }),
        result(1, { parameterServer: { strategy: 'ps', role: 'server', index: 0 } }),
      ]),
    ).toBeNull();
    expect(parameterServerSummary([result(0, {}, { role: 'boss' })])).toBeNull();
    // Counters that are not counts read as unknown, not as numbers.
    const odd = parameterServerSummary([
      result(
        0,
        {},
        {
          samples: { target: -1 },
          versions: ['x', 2],
          servers: [
            { index: 0, rank: 0, numel: 'many' },
            { index: 1, rank: 1, parameters: [2], numel: 5 },
          ],
        },
      ),
    ])!;
    expect(odd.samples).toBeNull();
    expect(odd.versions).toEqual([null, 2]);
    expect(odd.servers).toMatchObject([{ index: 1, rank: 1, numel: 5, version: 2 }]);
    // A rank with no breakdown does not break the train summary.
    expect(summarize('train', 1, [{ rank: 0, seconds: 1, weightHash: 'a' }]).breakdownMs).toEqual({});
  });
});
