/**
 * The shared job harness of the built-in training job: what every strategy's trainer (ddp_trainer.ts,
 * pipeline_trainer.ts, ps_trainer.ts) does alike. Its options and result, the data, the configuration
 * agreed with the session, the figures the ranks vote on, the dashboard's events and the links (the test-set
 * evaluation is evaluation.ts).
 */
import type * as tf from '@tensorflow/tfjs';
import {
  buildModel,
  type CharTokenizer,
  generate,
  textDatasets,
  fetchOffer,
  loadMnistSplits,
  loadOfferedDataset,
  loadOfferedModel,
  loadOfferedText,
  subset,
  type OfferRequest,
  syntheticDataset,
  type Dataset,
  type ElasticEvent,
  type ModelSpec,
  type ProcessGroup,
  type RendezvousEvent,
  type StoreClient,
} from '../../src/index.ts';
import { Mulberry32 } from '../../src/datasets/synthetic.ts';
import { InMemoryDataset } from '../../src/datasets/dataset.ts';
import type { LocalDataset } from '../../src/datasets/local.ts';
import { chooseFastest, PROBE_BUDGET_MS, selectBackend, type BackendChoice } from './backend.ts';
import { probeText } from './backend_probe.ts';
import { probeWebGpu } from '../webgpu.ts';
import { DEFAULT_CONTEXT, type TrainConfig } from '../../src/jobs/train_config.ts';
import type { TrainEvent } from './events.ts';
import { stepRanks } from './step_figures.ts';

export interface TrainerOptions {
  serverUrl: string;
  /** An open connection to the server (the page retries until it has one). */
  store: StoreClient;
  session: string;
  /**
   * The session's secret (checkpoints and the host's data need it). Read it at each use: the page
   * keeps it current (a getter) when the host removes a tab and the token changes.
   */
  token: string;
  /** The session's token changed (the host removed a tab): the page updates its link. */
  onToken?(token: string): void;
  /** A rank asked for in the URL (fixed-size sessions only). */
  rank: number | undefined;
  timeoutMs: number;
  config: TrainConfig;
  /** Test hooks from the URL: hash the weights every step; return rank 0's final weights. */
  flags: { checkWeights: boolean; returnWeights: boolean };
  emit(event: TrainEvent): void;
  /** Polled once a step: true once this tab asked everyone to stop. */
  stopRequested(): boolean;
  /** 'all' when a stop comes to every rank from the session's host (see runElastic's stopVote). Default 'any'. */
  stopVote?: 'any' | 'all';
  /** Called with the model as soon as it is built: the page can save this replica even if the run fails. A language model's vocabulary comes with it (its PyTorch export writes it). */
  onModel?(model: tf.LayersModel, vocabulary?: readonly string[]): void;
  /** The host secret of the creator's tab (kept when the tab reconnects). */
  host?: string;
  /** Wait as a spectator when the session is full, and take a rank when one frees up. */
  spectate?: boolean;
  /** The rendezvous' own events (spectating, the host's control). */
  onRendezvous?(e: RendezvousEvent): void;
  /** Polled between batches of the evaluation after the run: true once the host skipped it. */
  skipEvaluation?(): boolean;
  /** Dataset local: this tab's own pictures (the capture panel's), which never leave it; an empty one trains with zero samples. */
  localData?: LocalDataset;
}

export interface TrainResult {
  summary: Record<string, unknown>;
  /** The last round's group, still open: `close()` when done with it. */
  pg: ProcessGroup;
  close(): Promise<void>;
  model: tf.LayersModel;
  /** Predictions of the trained model on the first test samples (to check a download against). */
  probe: { inputs: Float32Array; inputShape: number[]; logits: Float32Array };
}

export class ConfigMismatchError extends Error {
  override name = 'ConfigMismatchError';
}

/** The host's images, resized for the built-in models (the host's own model takes its own input shape). */
export const OFFERED_IMAGE_SHAPE = [28, 28, 1];

/**
 * The job's training and test sets. The host's data (dataset 'user') comes from the server with
 * `offer`'s token, resized to `offer.inputShape`; every tenth sample is held out as the test set.
 */
export async function loadData(
  config: TrainConfig,
  offer?: { req: OfferRequest; inputShape: number[] },
  localData?: LocalDataset,
): Promise<{ train: Dataset; test: Dataset; text?: TextJob }> {
  if (config.dataset === 'local') {
    // This tab's own pictures: its held-out ones are its test set (the others' it never sees).
    if (!localData) throw new Error("this session trains on each tab's own pictures, and this tab brought none (not even an empty set)");
    const { inputs, labels } = { inputs: new Float32Array(0), labels: new Int32Array(0) };
    const none = new InMemoryDataset({
      name: `${localData.name} (held out)`,
      inputs,
      labels,
      inputShape: localData.inputShape,
      numClasses: localData.numClasses,
    });
    return { train: localData, test: localData.heldOut ?? none };
  }
  const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);
  const first = (d: Dataset, n: number) => (n > 0 && n < d.length ? subset(d, range(0, n)) : d);
  if (config.model === 'lm') {
    // The project's Moby-Dick, or the host's own text (dataset user: npm start -- --data FILE.txt).
    let corpus: { name: string; text: string };
    if (config.dataset === 'user') {
      if (!offer) throw new Error("the host's text needs the session's token to load");
      corpus = await loadOfferedText(offer.req);
    } else {
      const res = await fetch(new URL(TEXT_CORPUS, location.origin));
      if (!res.ok) throw new Error(`the text did not load: HTTP ${res.status} from ${TEXT_CORPUS}`);
      corpus = { name: 'moby-dick', text: await res.text() };
    }
    const { train, test, tokenizer, unigram } = textDatasets(corpus.text, {
      contextLength: config.context ?? DEFAULT_CONTEXT,
      name: corpus.name,
    });
    // Moby-Dick's opening words, or the host's text's own first characters where those are not in its vocabulary.
    const fits = Array.from(SAMPLE_PROMPT).every((c) => tokenizer.chars.includes(c));
    const prompt = fits ? SAMPLE_PROMPT : Array.from(corpus.text).slice(0, 8).join('');
    return { train: first(train, config.trainSize), test: first(test, config.testSize), text: { tokenizer, unigram, prompt } };
  }
  if (config.dataset === 'user') {
    if (!offer) throw new Error("the host's data needs the session's token to load");
    const all = await loadOfferedDataset(offer.req, offer.inputShape, { stream: config.streamData });
    // The same split on every tab: by index, so that each class (its files are listed together) is in both.
    const ids = range(0, all.length);
    const test = all.length >= 10 ? ids.filter((i) => i % 10 === 9) : ids;
    const train = all.length >= 10 ? ids.filter((i) => i % 10 !== 9) : ids;
    return {
      train: first(subset(all, train, `${all.name}-train`), config.trainSize),
      test: first(subset(all, test, `${all.name}-test`), config.testSize),
    };
  }
  if (config.dataset === 'mnist') {
    const { train, test } = await loadMnistSplits({ baseUrl: new URL('/datasets/mnist/', location.origin).toString() });
    return { train: first(train, config.trainSize), test: first(test, config.testSize) };
  }
  // Synthetic: one generated set cut into train and test, so both come from one distribution.
  const length = config.trainSize > 0 ? config.trainSize : 4096;
  const testLength = config.testSize > 0 ? Math.min(config.testSize, 1024) : 1024;
  const all = syntheticDataset({ length: length + 1024, inputSize: 16, numClasses: 4, seed: config.seed });
  return {
    train: subset(all, range(0, length), 'synthetic-train'),
    test: subset(all, range(length, length + testLength), 'synthetic-test'),
  };
}

/** The text the language model trains on (dataset 'text'): the project's copy of Moby-Dick, chapters 1-20 (datasets/). */
export const TEXT_CORPUS = '/datasets/text/moby-dick-1-20.txt';

/** A text job's tokenizer, the loss of a model that knows only the characters' frequencies (nats), and the prompt of its samples. */
export type TextJob = { tokenizer: CharTokenizer; unigram: number; prompt: string };

/** What the language model writes in the dashboard: this prompt (where the text has its characters), then SAMPLE_CHARS characters. */
export const SAMPLE_PROMPT = 'Call me ';
export const SAMPLE_CHARS = 120;

/**
 * A sample of the language model's writing after `step`: drawn at temperature 0.8 with a seed of
 * the step, so identical replicas write the same text on every tab.
 */
export async function sampleText(model: tf.LayersModel, text: TextJob, step: number): Promise<Extract<TrainEvent, { type: 'sample' }>> {
  const rng = new Mulberry32(step);
  const ids = await generate(model, text.tokenizer.encode(text.prompt), SAMPLE_CHARS, { temperature: 0.8, random: () => rng.nextFloat() });
  return { type: 'sample', step, prompt: text.prompt, text: text.tokenizer.decode(ids) };
}

// The per-step figures live with their dashboard view (step_figures.ts); trainers import them from here.
export type { CommMetrics, DeviceMetrics, Metrics, PipelineMetrics } from './step_figures.ts';

/** The model the job trains, as every strategy builds it (whole, or a pipeline stage's layers). Not for the host's model ('user'). */
export function modelSpecOf(config: TrainConfig, data: Dataset): ModelSpec {
  if (config.model === 'user') throw new Error("the host's model is loaded (newModelFor), not built from a spec");
  return {
    kind: config.model,
    inputShape: data.inputShape,
    numClasses: data.numClasses,
    seed: config.seed,
    ...(config.hidden === null ? {} : { hidden: config.hidden }),
  };
}

/**
 * What every strategy's trainer does first: say the configuration, start the backend (saying
 * why when it falls back), load the data while agreeing on the configuration with the session.
 */
export async function startJob(opts: TrainerOptions): Promise<{
  backend: BackendChoice;
  gpu: Awaited<ReturnType<typeof probeWebGpu>>;
  trainSet: Dataset;
  testSet: Dataset;
  text?: TextJob;
  newModel: () => Promise<tf.LayersModel>;
  modelName: string;
}> {
  const { config, emit } = opts;
  emit({ type: 'config', config });
  let backend = await selectBackend(config.backend);
  // auto's first backend only serves until the probe: what it fell back from is not news.
  if (backend.fallbackReason && config.backend !== 'auto')
    emit({ type: 'log', level: 'warn', message: `Backend fallback: ${backend.fallbackReason}` });
  const gpu = await probeWebGpu();
  // The token at each request: streamed data keeps loading after the host removed a tab.
  const req: OfferRequest = {
    url: opts.serverUrl,
    session: opts.session,
    get token() {
      return opts.token;
    },
  };
  const offered = config.model === 'user' || config.dataset === 'user' ? await fetchOffer(req) : null;
  if (config.model === 'user' && !offered?.model)
    throw new Error(
      "this session trains the host's own model, and the server offers none: the host starts it with npm start -- --model DIR",
    );
  if (config.dataset === 'user' && !offered?.data)
    throw new Error(
      "this session trains on the host's own data, and the server offers none: the host starts it with npm start -- --data DIR|FILE.csv|FILE.txt",
    );
  const inputShape = offered?.model && config.model === 'user' ? offered.model.inputShape : OFFERED_IMAGE_SHAPE;
  // The built-in models take one grey channel: a host's colour photos lose their colour, and the page says so.
  if (config.dataset === 'user' && offered?.data?.kind === 'images' && config.model !== 'user')
    emit({
      type: 'log',
      level: 'info',
      message: `The host's images reach the ${config.model} model as ${OFFERED_IMAGE_SHAPE[0]}x${OFFERED_IMAGE_SHAPE[1]} grey images (luminance, values 0..1): colour is kept only by the host's own model (npm start -- --model DIR taking [H, W, 3])`,
    });
  const dataPromise = loadData(config, { req, inputShape }, opts.localData);
  dataPromise.catch(() => {});
  await agreeOnConfig(opts);
  const { train: trainSet, test: testSet, text } = await dataPromise;
  if (config.model === 'user') {
    const m = offered!.model!;
    if (m.inputShape.join(',') !== trainSet.inputShape.join(','))
      throw new Error(
        `the host's model ${m.name} takes inputs [${m.inputShape.join(', ')}], and the ${config.dataset} data is [${trainSet.inputShape.join(', ')}]`,
      );
    if (m.outputUnits !== trainSet.numClasses)
      throw new Error(
        `the host's model ${m.name} has ${m.outputUnits} outputs, and the ${config.dataset} data ${trainSet.numClasses} classes`,
      );
  }
  let told = false;
  const newModel = async (): Promise<tf.LayersModel> => {
    if (config.model !== 'user') return buildModel(modelSpecOf(config, trainSet));
    const { model, note } = await loadOfferedModel(req);
    if (note && !told) emit({ type: 'log', level: 'info', message: `Your model: ${note}` });
    told = true;
    return model;
  };
  if (config.backend === 'auto') {
    // Timed on the job's own model and batch, now that both are known; before the first round.
    emit({
      type: 'log',
      level: 'info',
      message: `Backend auto: timing a few steps of this model on each backend (at most ${PROBE_BUDGET_MS / 1000} s each)…`,
    });
    backend = await chooseFastest(newModel, trainSet, config.batchSize, backend);
    emit({
      type: 'log',
      level: backend.fallbackReason ? 'warn' : 'info',
      message: `Backend auto: ${backend.backend}, the fastest here for this model: ${probeText(backend.probe ?? [], backend.backend)}`,
    });
  }
  // What the log calls the model: the host's by its name.
  const modelName = config.model === 'user' ? `"${offered!.model!.name}" (the host's)` : config.model;
  return { backend, gpu, trainSet, testSet, ...(text ? { text } : {}), newModel, modelName };
}

/** A started job: its backend, data and model maker (what startJob resolves to). */
export type StartedJob = Awaited<ReturnType<typeof startJob>>;

/** A failed round in plain words; this tab's own pause (`fixed`: min = max tabs) says what to do. */
function failureMessage(e: Extract<ElasticEvent, { type: 'failure' }>, fixed: boolean): string {
  // This tab's own pause, in plain words: the errors after it (closed links) would only confuse.
  const stalled = /^RankStalledError: this tab (.*)$/s.exec(e.error);
  if (stalled) {
    const next = fixed ? 'the other tabs wait for it' : 'the other tabs train on and take it back at their next step';
    return `This tab ${stalled[1]}. It rejoins now: ${next}. To avoid this, keep the computer awake and this tab in a window of its own.`;
  }
  return `Round failed at step ${e.step}${e.inFlight !== null ? ` (step ${e.inFlight} in flight)` : ''}: ${e.recoverable ? `${e.error.replace(/\.$/, '')}; waiting for the next round…` : e.error}`;
}

/** What the dashboard and the console hear of the run's own events. `fixed`: min = max tabs. */
export function dashboardEvents(emit: (e: TrainEvent) => void, fixed: boolean): (e: ElasticEvent) => void {
  const log = (level: 'info' | 'warn', message: string) => emit({ type: 'log', level, message });
  let paused = false;
  /** A lost GPU, told when the rank is back in a round. */
  let deviceLost: Extract<ElasticEvent, { type: 'device-lost' }> | undefined;
  return (e) => {
    switch (e.type) {
      case 'epoch':
        return emit({ type: 'shard', epoch: e.epoch, samples: e.samples, datasetSize: e.datasetLength, stepsPerEpoch: e.stepsPerEpoch });
      case 'step':
        return emit({
          type: 'step',
          epoch: e.epoch,
          step: e.step,
          totalSteps: e.totalSteps,
          ranks: stepRanks(e),
          elapsedSec: e.elapsedMs / 1000,
        });
      case 'round':
        // 'joined' (from onRound) tells the dashboard the rank; a resumed run also says from where.
        paused = false;
        if (deviceLost) {
          const lost = deviceLost;
          deviceLost = undefined;
          log(
            'warn',
            `This tab's GPU was reset (${lost.reason}: ${lost.message}); it rejoined the group with a fresh ${lost.backend} backend at step ${e.step}`,
          );
        }
        if (e.stepsRedone !== undefined) emit({ type: 'steps-redone', steps: e.stepsRedone });
        return e.note ? log('info', `New group of ${e.worldSize}: ${e.note}`) : undefined;
      case 'device-lost':
        deviceLost = e;
        return log(
          'warn',
          `This tab's GPU was lost during ${e.during} (${e.reason}); ${e.backend} runs again after ${Math.round(e.rebuildMs)} ms: rejoining the group…`,
        );
      case 'paused':
        paused = true;
        return;
      case 'waiting':
        if (e.running) return e.waiting > 0 ? log('info', `${e.waiting} tab(s) waiting to join at the next step`) : undefined;
        return emit({ type: 'waiting', arrived: e.members, min: e.min, max: e.max, paused });
      case 'regroup':
        return log('info', `Tabs are waiting to join: regrouping after step ${e.step}`);
      case 'failure':
        return log('warn', failureMessage(e, fixed));
      case 'reconnecting': {
        const when = `${Math.round(e.waitMs / 100) / 10} s (attempt ${e.attempt})`;
        // Only a closed connection means the server may be gone; an eviction or a pause is this tab's own story.
        if (e.reason.startsWith('connection closed')) return log('warn', `Server unreachable (${e.reason}); reconnecting in ${when}`);
        return log('warn', `${e.reason[0]!.toUpperCase()}${e.reason.slice(1)}; rejoining in ${when}`);
      }
      case 'reconnected':
        return log('info', 'Reconnected to the server');
      case 'store':
        return emit({ type: 'store', unavailable: e.available ? null : e.message });
      case 'checkpoint':
        return log('info', `Checkpoint ${e.name} saved (step ${e.step}, ${e.bytes} bytes)`);
      case 'checkpoint-failed':
        return log('warn', `Checkpoint at step ${e.step} failed: ${e.error}`);
      case 'checkpoint-skipped':
        return log('warn', `Checkpoint ${e.name} is unusable (${e.reason}); using an older one`);
      case 'aggregation': {
        // The dashboard's "Contribution" column; the rank that reports is this tab, not news.
        const { rank: _rank, ...judged } = e;
        return emit(judged);
      }
      case 'batch':
      case 'peer-lost':
      case 'end':
        return;
      default: {
        const unknown: never = e;
        void unknown;
      }
    }
  };
}

/** Every tab of a session must train the same job: the first to arrive sets it. */
export async function agreeOnConfig(opts: TrainerOptions): Promise<void> {
  const mine = JSON.stringify(opts.config);
  const theirs = new TextDecoder().decode(await opts.store.compareSet('__train/config', '', mine));
  if (theirs === mine) return;
  let session: Record<string, unknown> = {};
  try {
    session = JSON.parse(theirs) as Record<string, unknown>;
  } catch {
    // a foreign value under the key: every field differs
  }
  const agreed = JSON.parse(mine) as Record<string, unknown>;
  const diffs = Object.keys(agreed)
    .filter((k) => JSON.stringify(session[k]) !== JSON.stringify(agreed[k]))
    .map((k) => `${k}: session ${JSON.stringify(session[k])}, this tab ${JSON.stringify(agreed[k])}`);
  throw new ConfigMismatchError(`this tab's configuration disagrees with session "${opts.session}": ${diffs.join('; ')}`);
}

/** The group whose links the dashboard shows: the latest round's (one training run per page). */
let watchedGroup: ProcessGroup | null = null;

/**
 * Link states and lost ranks for the dashboard, and every two seconds each link's traffic and
 * network path (candidate types, round-trip time, bytes per second on the wire).
 */
export function watchLinks(pg: ProcessGroup, emit: (e: TrainEvent) => void): void {
  const last = new Map<number, { t: number; bytes: number }>();
  watchedGroup = pg;
  pg.on((e) => {
    // A group the page left behind (a new round formed) still closes its links: its late events
    // would name ranks of the new numbering, live ones among them.
    if (watchedGroup !== pg) return;
    if (e.type === 'link') emit({ type: 'link', peer: e.peer, state: e.state });
    else emit({ type: 'rank-lost', rank: e.rank, reason: e.reason });
  });
  let reading = false;
  const timer = setInterval(() => {
    if (pg.error || watchedGroup !== pg) return clearInterval(timer);
    // getStats is asynchronous: a slow reading is skipped over, never stacked.
    if (reading) return;
    reading = true;
    pg.linkDetails(1_500)
      .then((details) => {
        const now = performance.now();
        for (const l of details) {
          const bytes = l.bytesSent + l.bytesReceived;
          const prev = last.get(l.peer);
          last.set(l.peer, { t: now, bytes });
          if (prev && l.state === 'open') {
            emit({
              type: 'link',
              peer: l.peer,
              state: l.state,
              throughputMBps: (bytes - prev.bytes) / 1e6 / ((now - prev.t) / 1000),
              ...(l.path ? { path: l.path } : {}),
            });
          }
        }
      })
      .catch(() => {})
      .finally(() => (reading = false));
  }, 2000);
}
