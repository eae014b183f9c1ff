/**
 * A pipeline run's end on this tab: the evaluation after the run (unless one just ran), the
 * whole model's weights gathered on rank 0 (--dump-weights), the probe, and the summary with
 * this stage's figures (its layers, memory, bubble and breakdown).
 */
import { fetchBatch, type PipelineRoundContext, type PipelineRunResult, type PipelineStage } from '../../src/index.ts';
import { bubbleFraction } from '../../src/parallel/pipeline/schedule.ts';
import { hashFloat32 } from '../../src/wire/hash.ts';
import { slowFactor } from '../../src/runtime/straggler.ts';
import { flatTrainableWeights } from '../../src/parallel/replicas.ts';
import { encodeValue } from '../../src/wire/protocol.ts';
import { linkReport } from '../report.ts';
import type { PipelineMesh } from '../../src/parallel/pipeline/runner.ts';
import type { StartedJob, TrainerOptions, TrainResult } from './harness.ts';
import type { TrainConfig } from '../../src/jobs/train_config.ts';
import type { TrainJobResult } from '../../src/jobs/job_report.ts';

type Evaluation = { step: number; testAccuracy: number; testLoss: number };

/** What the summary reads of a pipeline run on this tab (PipelineTrainer keeps it): the job and this stage's figures over the steps. */
export interface PipelineRunRecord {
  readonly config: TrainConfig;
  readonly opts: TrainerOptions;
  readonly job: StartedJob;
  readonly emit: TrainerOptions['emit'];
  /** performance.now() when the trainer was made. */
  readonly started: number;
  readonly sums: Readonly<Record<'compute' | 'waitActivations' | 'waitGradients' | 'allreduce' | 'apply' | 'bubble' | 'slowed', number>>;
  readonly timedSteps: number;
  readonly samplesPerSecTotal: number;
  readonly peakTensors: number;
  readonly peakStashed: number;
  readonly tensorCounts: readonly number[];
  readonly hashChecks: readonly boolean[];
  readonly lastLoss: number;
  readonly evals: readonly Evaluation[];
  /** An evaluation of the pipeline, emitted (and kept in evals). */
  evaluateAndEmit(ctx: PipelineRoundContext, step: number, epoch: number): Promise<Evaluation>;
}

/** This rank's place in the S x D layout, as the dashboard and the summary say it. */
export function placeOf(mesh: PipelineMesh): { stage: number; stages: number; replica: number; replicas: number } {
  return { stage: mesh.stage, stages: mesh.stages, replica: mesh.replica, replicas: mesh.replicas };
}

export async function pipelineResult(t: PipelineRunRecord, run: PipelineRunResult): Promise<TrainResult> {
  const { emit, config } = t;
  const { testSet } = t.job;
  const { mesh, stage, ddp } = run;
  const ctx: PipelineRoundContext = { mesh, stage, ddp, step: run.steps, epoch: run.epoch };
  if (run.stoppedBy !== null) emit({ type: 'stopped', by: run.stoppedBy, atStep: run.steps });
  const latest = t.evals.at(-1);
  const final = latest?.step === run.steps ? latest : await t.evaluateAndEmit(ctx, run.steps, run.epoch);
  const weights = await flatTrainableWeights(stage.model);
  const whole = t.opts.flags.returnWeights ? await gatherModelWeights(stage, mesh.replica, weights) : null;
  // What the trained pipeline predicts on the first test samples (the last stage holds the logits).
  const probeCount = Math.min(8, testSet.length);
  const probeBatch = await fetchBatch(
    testSet,
    Array.from({ length: probeCount }, (_, i) => i),
  );
  const logitsT = await stage.forward({ batchSize: probeCount, ...(stage.isFirst ? { inputs: probeBatch.x } : {}) });
  const logits = logitsT ? ((await logitsT.data()) as Float32Array) : new Float32Array(0);
  logitsT?.dispose();
  const links = await linkReport(mesh.world);
  const { sums, tensorCounts } = t;
  const mean = (v: number) => (t.timedSteps > 0 ? v / t.timedSteps : null);
  const summary: TrainJobResult = {
    rank: mesh.world.rank,
    worldSize: mesh.world.worldSize,
    backend: t.job.backend.backend,
    model: config.model,
    dataset: config.dataset,
    steps: run.steps,
    epochs: run.epoch,
    samplesPerSec: mean(t.samplesPerSecTotal),
    finalLoss: t.lastLoss,
    testAccuracy: final.testAccuracy,
    testLoss: final.testLoss,
    // The language model: its test loss per character as a perplexity (the stages cannot sample: each holds a part).
    ...(config.model === 'lm' ? { perplexity: Math.exp(final.testLoss) } : {}),
    weightHash: hashFloat32(weights),
    breakdownMs: {
      compute: mean(sums.compute),
      waitActivations: mean(sums.waitActivations),
      waitGradients: mean(sums.waitGradients),
      allreduce: mean(sums.allreduce),
      apply: mean(sums.apply),
      // --slow: this rank's own waits, as every figure here is this rank's.
      ...(config.slow !== null ? { slowed: mean(sums.slowed) } : {}),
    },
    // --slow: this rank's factor (its stage is slowed) and the ms it waited per step on average.
    ...(config.slow !== null ? { slowFactor: slowFactor(config.slow, mesh.world.rank), slowedMs: mean(sums.slowed) } : {}),
    seconds: (performance.now() - t.started) / 1000,
    generations: run.generations,
    stepsRedone: run.stepsRedone,
    resumes: run.resumes,
    liveTensors: { steps: tensorCounts.length, min: Math.min(...tensorCounts), max: Math.max(...tensorCounts) },
    pipeline: {
      ...placeOf(mesh),
      schedule: config.schedule,
      microBatches: config.microBatches,
      activationDtype: config.activationDtype,
      layers: stage.layers.map((l) => l.index),
      layerClasses: stage.layers.map((l) => l.className),
      parameters: stage.parameterCount,
      peakLiveTensors: t.peakTensors,
      peakStashedMicroBatches: t.peakStashed,
      bubble: { measured: mean(sums.bubble), formula: bubbleFraction(mesh.stages, config.microBatches) },
      breakdownMs: {
        compute: mean(sums.compute),
        waitActivations: mean(sums.waitActivations),
        waitGradients: mean(sums.waitGradients),
        allreduce: mean(sums.allreduce),
        apply: mean(sums.apply),
      },
      weightHash: hashFloat32(weights),
    },
    links,
    ...(t.opts.flags.checkWeights ? { identicalEveryStep: t.hashChecks.every(Boolean), checkedSteps: t.hashChecks.length } : {}),
    ...(run.stoppedBy !== null ? { stoppedBy: run.stoppedBy } : {}),
    ...(whole ? { weights: encodeValue(new Uint8Array(whole.buffer, whole.byteOffset, whole.byteLength)) } : {}),
  };
  emit({ type: 'done', summary });
  return {
    summary,
    model: stage.model,
    pg: mesh.world,
    close: run.close,
    probe: { inputs: stage.isLast ? probeBatch.x : new Float32Array(0), inputShape: testSet.inputShape, logits },
  };
}

/**
 * The whole model's trainable weights in model order, on replica 0's first stage (world rank 0):
 * every other stage of replica 0 sends its own; other replicas hold copies and send nothing.
 */
async function gatherModelWeights(stage: PipelineStage, replica: number, mine: Float32Array): Promise<Float32Array | null> {
  if (replica !== 0) return null;
  const pipe = stage.group;
  if (!stage.isFirst) {
    await pipe.send(Float32Array.of(mine.length), 0);
    await pipe.send(mine, 0);
    return null;
  }
  const parts = [mine];
  for (let s = 1; s < stage.numStages; s++) {
    const [length] = await pipe.recv(new Float32Array(1), s);
    parts.push(await pipe.recv(new Float32Array(length!), s));
  }
  const whole = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    whole.set(p, at);
    at += p.length;
  }
  return whole;
}
