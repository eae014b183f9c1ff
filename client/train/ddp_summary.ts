/**
 * A DDP run's end on this tab: the evaluation after the run (unless one just ran), the probe of
 * the trained model, the bare all-reduce beside the step's communication, and the summary the
 * page reports.
 */
import type * as tf from '@tensorflow/tfjs';
import { isRecoverable, type DataParallel, type ElasticRunResult, type ProcessGroup } from '../../src/index.ts';
import { hashFloat32 } from '../../src/wire/hash.ts';
import { slowFactor } from '../../src/runtime/straggler.ts';
import { encodeValue } from '../../src/wire/protocol.ts';
import { DiLoCo } from '../../src/parallel/diloco/diloco.ts';
import { linkReport } from '../report.ts';
import { bareBucketsAllReduce, commHookSummary, dilocoOverlap, overlapOf, stepTimeline } from './ddp_figures.ts';
import type { StartedJob, TrainerOptions, TrainResult } from './harness.ts';
import type { BackendChoice } from './backend.ts';
import type { CommSetup } from './comm.ts';
import type { ContributionTracker } from './contributions.ts';
import type { StepBreakdownMs, TrainEvent } from './events.ts';
import type { TrainConfig } from '../../src/jobs/train_config.ts';
import { probeOf } from './job_options.ts';
import type { JobResult, TrainJobResult } from '../../src/jobs/job_report.ts';

type Evaluation = { step: number; testAccuracy: number; testLoss: number };

/** What the summary reads of a DDP run on this tab (DdpTrainer keeps it): the job, the model, and the figures gathered over the steps. */
export interface DdpRunRecord {
  readonly config: TrainConfig;
  readonly opts: TrainerOptions;
  readonly job: StartedJob;
  readonly emit: (e: TrainEvent) => void;
  /** performance.now() when the trainer was made. */
  readonly started: number;
  readonly backend: BackendChoice;
  readonly model: tf.LayersModel;
  readonly dp: DataParallel | undefined;
  readonly comm: CommSetup;
  readonly judged: Pick<ContributionTracker, 'result'>;
  readonly sums: StepBreakdownMs & { slowed: number };
  readonly bytes: {
    readonly sent: number;
    readonly dense: number;
    readonly averagings: number;
    readonly afterStart: number;
    readonly stepsAfterStart: number;
  };
  readonly commSpan: number;
  readonly own: Readonly<Record<'compute' | 'readback' | 'waitSlowest' | 'wire' | 'apply' | 'batch', number>>;
  readonly slowedTotal: number;
  readonly timedSteps: number;
  readonly samplesPerSecTotal: number;
  readonly tensorCounts: readonly number[];
  readonly hashChecks: readonly boolean[];
  readonly lastLoss: number;
  readonly evals: readonly Evaluation[];
  readonly lastSample: Extract<TrainEvent, { type: 'sample' }> | undefined;
  readonly sampleSteps: readonly number[];
  /** The evaluation after the run; null when the host skipped it. */
  finalEvaluation(pg: ProcessGroup, step: number, epoch: number): Promise<Evaluation | null>;
}

/** The run's result: the summary (also emitted as 'done'), the model, the group, and the probe. */
export async function ddpResult(t: DdpRunRecord, run: ElasticRunResult): Promise<TrainResult> {
  const { emit } = t;
  const { testSet } = t.job;
  const { pg } = run;
  if (run.stoppedBy !== null) emit({ type: 'stopped', by: run.stoppedBy, atStep: run.steps });
  const latest = t.evals.at(-1);
  // The collectives after the run: a tab closed as it ended costs figures, not the run.
  const final = latest?.step === run.steps ? latest : await t.finalEvaluation(pg, run.steps, run.epoch);
  const weights = await run.ddp.flatWeights();
  const probe = await probeOf(t.model, testSet);
  const links = await linkReport(pg);
  // The same reductions bare, in the same run on the same group: what the step's communication is held against.
  // A measurement after the run: a rank lost now (a tab frozen at the last step) costs the figure, not the run.
  const bareAllReduceMs = await bareBucketsAllReduce(pg, run.ddp.buckets).catch((err: unknown) => {
    if (!isRecoverable(err)) throw err;
    emit({ type: 'log', level: 'warn', message: `The bare all-reduce measured after the run was not taken: ${(err as Error).message}` });
    return null;
  });
  const summary: TrainJobResult = {
    ...runPart(t, run, final),
    weightHash: hashFloat32(weights),
    ...commPart(t, run),
    // Where this rank's step went, mean ms per timed step (see stepTimeline); and the float32
    // all-reduce of the buckets alone, timed after training on the same group.
    timelineMs: stepTimeline(t.own, t.timedSteps, run.timeline),
    bareAllReduceMs,
    ...tabPart(t, run),
    // The final group's links: which way each one's bytes went (host, srflx, prflx, relay).
    links,
    ...(t.opts.flags.checkWeights ? { identicalEveryStep: t.hashChecks.every(Boolean), checkedSteps: t.hashChecks.length } : {}),
    ...(run.stoppedBy !== null ? { stoppedBy: run.stoppedBy } : {}),
    ...t.judged.result(),
    ...(t.opts.flags.returnWeights && pg.rank === 0
      ? { weights: encodeValue(new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength)) }
      : {}),
  };
  emit({ type: 'done', summary });
  return { summary, model: t.model, pg, close: run.close, probe };
}

/** The run and its model: who, on what, how far, how fast, how well (the language model's figures too). */
function runPart(
  t: DdpRunRecord,
  run: ElasticRunResult,
  final: { testAccuracy: number; testLoss: number } | null,
): Pick<TrainJobResult, 'rank' | 'worldSize' | 'backend' | 'model' | 'dataset' | 'steps' | 'epochs'> & JobResult {
  const { config, backend, timedSteps, samplesPerSecTotal } = t;
  const { trainSet, text } = t.job;
  return {
    rank: run.pg.rank,
    worldSize: run.pg.worldSize,
    backend: backend.backend,
    // backend=auto: what each backend measured (ms per step of this model), the chosen one above.
    ...(backend.probe ? { backendProbe: backend.probe } : {}),
    model: config.model,
    ...(config.hidden === null ? {} : { hiddenUnits: config.hidden }),
    parameters: t.model.countParams(),
    dataset: config.dataset,
    // The host's images fetched as the steps needed them (--stream-data), not all at the start.
    ...(config.dataset === 'user' ? { dataStreamed: trainSet.prepare !== undefined } : {}),
    steps: run.steps,
    epochs: run.epoch,
    samplesPerSec: timedSteps > 0 ? samplesPerSecTotal / timedSteps : null,
    finalLoss: t.lastLoss,
    // null when the host skipped the evaluation after the run.
    testAccuracy: final?.testAccuracy ?? null,
    testLoss: final?.testLoss ?? null,
    ...(final === null ? { evaluationSkipped: true } : {}),
    // The language model: its test loss per character as a perplexity, the baseline of the
    // characters' frequencies, characters per second, and what it writes at the end.
    ...(text && t.lastSample
      ? {
          perplexity: final === null ? null : Math.exp(final.testLoss),
          unigram: text.unigram,
          context: trainSet.inputShape[0],
          tokensPerSec: timedSteps > 0 ? (samplesPerSecTotal / timedSteps) * trainSet.inputShape[0]! : null,
          sample: t.lastSample.prompt + t.lastSample.text,
          sampleSteps: t.sampleSteps,
        }
      : {}),
    // Averaged over ranks, as every figure of the breakdown (`slowed` only when the job has stragglers).
    breakdownMs: Object.fromEntries(
      Object.entries(t.sums)
        .filter(([key]) => key !== 'slowed' || config.slow !== null)
        .map(([key, v]) => [key, timedSteps > 0 ? v / timedSteps : null]),
    ),
  };
}

/** --comm-hook: the hook, this rank's mean bytes per timed step, their share of the float32 all-reduce's, and the overlap. */
function commPart(t: DdpRunRecord, run: ElasticRunResult): Record<string, unknown> {
  const { bytes, timedSteps } = t;
  return {
    commHook: commHookSummary(t.comm, run.ddp.commHook.name, run.ddp.parameterCount, run.pg, bytes.averagings),
    bytesPerStep: timedSteps > 0 ? bytes.sent / timedSteps : null,
    denseBytesPerStep: timedSteps > 0 ? bytes.dense / timedSteps : null,
    compressionRatio: bytes.dense > 0 ? bytes.sent / bytes.dense : null,
    // The same after the hook's start (PowerSGD's plain warm-up steps left out).
    bytesPerStepAfterStart: bytes.stepsAfterStart > 0 ? bytes.afterStart / bytes.stepsAfterStart : null,
    // Overlap: of the communication's span per step, what ran while buckets were still being read
    // back (hidden) and what the step waited for at its end (exposed, breakdownMs.allreduce). Averaged over ranks.
    // DiLoCo: of its outer all-reduces' time on the wire, what ran behind the next inner steps.
    overlap: run.ddp.commHook instanceof DiLoCo ? dilocoOverlap(run.ddp.commHook) : overlapOf(timedSteps, t.commSpan, t.sums.allreduce),
  };
}

/** This tab's own: its devices, its --slow factor, its time, the run's rounds, and its live tensors. */
function tabPart(t: DdpRunRecord, run: ElasticRunResult): Pick<TrainJobResult, 'seconds' | 'generations'> & JobResult {
  const { config, timedSteps, tensorCounts } = t;
  return {
    // --devices: how many this rank computed on and, with more than one, each one's backend and figures.
    devices: config.devices,
    ...(t.dp ? { deviceReports: t.dp.deviceStats() } : {}),
    // --slow: this rank's factor (in the last round) and the ms it waited per step on average.
    ...(config.slow !== null
      ? { slowFactor: slowFactor(config.slow, run.pg.rank), slowedMs: timedSteps > 0 ? t.slowedTotal / timedSteps : null }
      : {}),
    seconds: (performance.now() - t.started) / 1000,
    generations: run.generations,
    stepsRedone: run.stepsRedone,
    pausedGenerations: run.pausedGenerations,
    resumes: run.resumes,
    // Live tensors after each step: flat when nothing leaks.
    liveTensors: { steps: tensorCounts.length, min: Math.min(...tensorCounts), max: Math.max(...tensorCounts) },
  };
}
