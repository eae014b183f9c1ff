/**
 * The launcher's pipeline flags (--pp, --dp, --micro-batches for --job train) are checked before
 * anything starts: the pure check in launcher/run.ts, and the command line's exit code 2 with the
 * message (each case fails before a server or a browser would start).
 */
import { describe, expect, it } from 'vitest';
import { refusalLine, refusalOf } from './fixtures/launch_cli.ts';
import { pipelineProblems, trainJobProblem } from '../launcher/job_flags.ts';

describe('pipelineProblems', () => {
  it("every other rule of the train job is checked with the pages' own schema, before a page opens, naming the flag", () => {
    expect(trainJobProblem({ batchSize: '32', steps: '10' }, 2)).toBeUndefined();
    expect(trainJobProblem({ strategy: 'ps', min: '2', 'comm-hook': 'powersgd:2' }, 3)).toMatch(
      /^--comm-hook powersgd:2: the train job takes none \(or left out\) with strategy ps/,
    );
    expect(trainJobProblem({ dataset: 'cifar' }, 2)).toBe(
      '--dataset cifar: the train job takes one of mnist, synthetic, text, user, local',
    );
    expect(trainJobProblem({ model: 'mlp', hidden: '0' }, 2)).toMatch(/^--hidden 0: the train job takes from 1 to 4096 for the mlp/);
    expect(trainJobProblem({}, 65)).toMatch(/^--nproc \(x --nnodes\) 65: the train job takes an integer from 1 to 64/);
  });

  it('accepts S x D ranks, with --dp defaulting to 1, in kebab or camel case, and --min/--max equal to the world', () => {
    expect(pipelineProblems({ pp: '2', dp: '2', 'micro-batches': '4' }, { nproc: 4 })).toEqual([]);
    expect(pipelineProblems({ pp: '4' }, { nproc: 4 })).toEqual([]);
    expect(pipelineProblems({ pp: '2', dp: '2', microBatches: '8', min: '4', max: '4' }, { nproc: 4 })).toEqual([]);
    // Two machines of 2 ranks each: a world of 4.
    expect(pipelineProblems({ pp: '2', dp: '2' }, { nproc: 2, nnodes: 2 })).toEqual([]);
    // No pipeline flags at all: nothing to say, whatever the rest.
    expect(pipelineProblems({ min: '1', max: '4' }, { nproc: 3 })).toEqual([]);
  });

  it('names --nproc, --pp and --dp when the world is not S x D', () => {
    expect(pipelineProblems({ pp: '2', dp: '2' }, { nproc: 3 })).toEqual(['--nproc 3 must be --pp 2 x --dp 2 = 4 ranks']);
    expect(pipelineProblems({ pp: '2' }, { nproc: 4 })).toEqual(['--nproc 4 must be --pp 2 x --dp 1 = 2 ranks (--dp defaults to 1)']);
    expect(pipelineProblems({ pp: '2', dp: '2' }, { nproc: 3, nnodes: 2 })).toEqual([
      '--nnodes 2 x --nproc 3 = 6 ranks must be --pp 2 x --dp 2 = 4 ranks',
    ]);
  });

  it("wants integers in the schema's bounds (its rule, phrased as the flag)", () => {
    for (const bad of ['0', '-1', '1.5', 'two', 'true', '', '65']) {
      expect(pipelineProblems({ pp: bad }, { nproc: 2 })).toEqual([`--pp must be an integer from 1 to 64 (pipeline stages), got "${bad}"`]);
    }
    expect(pipelineProblems({ pp: '2', dp: 'x', 'micro-batches': '0' }, { nproc: 2 })).toEqual([
      '--dp must be an integer from 1 to 64 (replicas of the pipeline), got "x"',
      `--micro-batches must be an integer from 1 to 64 (micro-batches per replica's batch), got "0"`,
    ]);
  });

  it('--dp and --micro-batches need --pp', () => {
    expect(pipelineProblems({ dp: '2' }, { nproc: 2 })).toEqual(['--dp is for pipeline runs: add --pp S, the number of pipeline stages']);
    expect(pipelineProblems({ dp: '2', microBatches: '4' }, { nproc: 2 })).toEqual([
      '--dp and --microBatches are for pipeline runs: add --pp S, the number of pipeline stages',
    ]);
    expect(pipelineProblems({ pp: '1', dp: '2' }, { nproc: 2 })[0]).toMatch(/^--dp 2 needs --pp 2 or more/);
    // --pp 1 is plain data parallelism: any size, elastic too.
    expect(pipelineProblems({ pp: '1', min: '2', max: '4' }, { nproc: 3 })).toEqual([]);
  });

  it('a pipeline run is a fixed size: --min or --max other than the world is refused', () => {
    expect(pipelineProblems({ pp: '2', dp: '2', min: '2' }, { nproc: 4 })).toEqual([
      'a pipeline run is a fixed size: --min 2 must be left out or equal the 4 ranks',
    ]);
    expect(pipelineProblems({ pp: '2', dp: '2', min: '4', max: '6' }, { nproc: 4 })).toEqual([
      'a pipeline run is a fixed size: --max 6 must be left out or equal the 4 ranks',
    ]);
  });

  it('more micro-batches than samples in a batch is refused when the batch size is given', () => {
    expect(pipelineProblems({ pp: '2', 'micro-batches': '16', 'batch-size': '8' }, { nproc: 2 })).toEqual([
      "--micro-batches 16 must be at most --batch-size 8: each micro-batch needs a sample of the replica's batch",
    ]);
  });
});

describe('npm run launch -- --job train --pp ...', () => {
  // What the command line prints before it exits 2 (test/fixtures/launch_cli.ts; rank_browsers runs the real command).
  it('refuses the command line before starting anything, saying what to give', () => {
    const r = refusalOf('--nproc', '3', '--job', 'train', '--pp', '2', '--dp', '2');
    expect(r.split('\n')[0]).toBe('--nproc 3 must be --pp 2 x --dp 2 = 4 ranks');
    expect(r).toMatch(/--pp S \(stages, one per rank\)/);
    expect(refusalLine('--nproc', '2', '--job', 'train', '--micro-batches', '4')).toBe(
      '--micro-batches is for pipeline runs: add --pp S, the number of pipeline stages',
    );
    expect(refusalLine('--nproc', '4', '--job', 'train', '--pp', '2', '--dp', '2', '--min', '2', '--max', '4')).toBe(
      'a pipeline run is a fixed size: --min 2 must be left out or equal the 4 ranks',
    );
  });
});
