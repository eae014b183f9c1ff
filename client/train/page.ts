/**
 * The training page: the dashboard, the trainer, and the controls that connect them. Humans and
 * the launcher's headless ranks use the same page; the launcher also gets reports.
 */
import * as tf from '@tensorflow/tfjs';
import { ConnectionClosedError, DistTimeoutError, NonFiniteGradientError, RendezvousError, ReplicaDivergenceError, StoreClient, PeerLostError, UnauthorizedError } from '../../src/index.ts';
import { MissingTokenError, pageToken } from '../page_token.ts';
import { Dashboard } from '../ui/dashboard.ts';
import { report, reportElasticEvents } from '../report.ts';
import { ConfigError, parseTrainConfig, urlOption } from './config.ts';
import { ConfigMismatchError, train, type TrainResult } from './trainer.ts';
import type { TrainEvent } from './events.ts';
import { downloadModel } from './download.ts';

export interface TrainPageOptions {
  root: HTMLElement;
  params: URLSearchParams;
  session: string;
  rank: number | undefined;
  timeoutMs: number;
}

/** A line per notable event, for the console (the launcher prefixes it with the rank). */
function logLine(e: TrainEvent, logEvery: number): string | undefined {
  switch (e.type) {
    case 'joined':
      return `rank ${e.rank}/${e.worldSize} on ${e.backend}${e.adapter ? ` (${e.adapter})` : ''}${e.fallbackReason ? `: ${e.fallbackReason}` : ''}`;
    case 'step': {
      if (e.step !== 1 && e.step % logEvery !== 0 && e.step !== e.totalSteps) return undefined;
      const loss = e.ranks.reduce((s, r) => s + r.loss, 0) / e.ranks.length;
      return `epoch ${e.epoch} step ${e.step}/${e.totalSteps} loss ${loss.toFixed(4)}`;
    }
    case 'eval':
      return `epoch ${e.epoch} step ${e.step}: test accuracy ${(e.testAccuracy * 100).toFixed(2)}%, test loss ${e.testLoss.toFixed(4)}`;
    case 'log':
      return `${e.level}: ${e.message}`;
    case 'shard':
      return `epoch ${e.epoch}: ${e.samples} of ${e.datasetSize} samples on this rank, ${e.stepsPerEpoch} steps`;
    case 'stopped':
      return `stopped by rank ${e.by} at step ${e.atStep}`;
    case 'rank-lost':
      return `lost rank ${e.rank}: ${e.reason}`;
    case 'config':
    case 'waiting':
    case 'link':
    case 'done':
      return undefined;
    default: {
      const unknown: never = e;
      return String(unknown);
    }
  }
}

/** Connects to the server, retrying with backoff (and saying so) while it is unreachable. */
async function connectWithRetry(dash: Dashboard, origin: string, session: string, token: string, timeoutMs: number): Promise<StoreClient> {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 0; ; attempt++) {
    try {
      const store = await StoreClient.connect(origin, { session, token, timeoutMs });
      dash.clearError();
      return store;
    } catch (err) {
      if (!(err instanceof ConnectionClosedError || err instanceof DistTimeoutError) || Date.now() > deadline) throw err;
      const wait = Math.min(15_000, 1000 * 2 ** attempt);
      dash.showError('Server unreachable', `Could not reach the training server at ${origin}.`, `Retrying in ${Math.round(wait / 1000)} s. Check that "npm start" is running on the host.`);
      await new Promise((r) => setTimeout(r, wait));
    }
  }
}

export async function trainPage(opts: TrainPageOptions): Promise<void> {
  const { root, params, session } = opts;
  root.removeAttribute('aria-live'); // the dashboard manages its own live regions
  let stop = false;
  let result: TrainResult | undefined;
  // Before the dashboard takes the share link from the address bar: a link without a token gets one.
  let token: string | Error;
  try {
    token = pageToken(true);
  } catch (err) {
    token = err as Error;
  }
  const dash = new Dashboard(root, {
    session,
    shareUrl: location.href.replace(/([?&])rank=\d+&?/, '$1').replace(/[?&]$/, ''),
    onStop: () => {
      stop = true;
    },
    onDownload: () => {
      if (!result) return;
      downloadModel(result.model).then(
        () => console.log('model downloaded: browser-ddp-model.json + browser-ddp-model.weights.bin'),
        (err: Error) => {
          console.error(`download failed: ${err.message}`);
          dash.showError('Download failed', err.message);
        },
      );
    },
  });
  const logEvery = Math.max(1, Number(params.get('logEvery') ?? 20));
  const emit = (e: TrainEvent) => {
    dash.handle(e);
    const line = logLine(e, logEvery);
    if (line) console.log(line);
    if (e.type === 'joined') report({ type: 'rank', rank: e.rank, worldSize: e.worldSize });
  };
  reportElasticEvents();
  try {
    if (token instanceof Error) throw token;
    const config = parseTrainConfig((name) => urlOption(params, name));
    const flags = { checkWeights: params.get('checkWeights') === 'true', returnWeights: params.get('returnWeights') === 'true' };
    const store = await connectWithRetry(dash, location.origin, session, token, opts.timeoutMs);
    result = await train({ serverUrl: location.origin, store, session, token, rank: opts.rank, timeoutMs: opts.timeoutMs, config, flags, emit, stopRequested: () => stop });
    // For tests: what the page's model predicts on the first test samples.
    const probe = { inputs: Array.from(result.probe.inputs), inputShape: result.probe.inputShape, logits: Array.from(result.probe.logits) };
    (window as unknown as { __ddpModel?: tf.LayersModel }).__ddpModel = result.model;
    report({ type: 'result', result: { ...result.summary, probe } });
  } catch (err) {
    const e = err instanceof Error ? err : new Error(String(err));
    const [title, action] = explain(e);
    dash.fail(title, e.message, action);
    console.error(`${e.name}: ${e.message}`);
    report({ type: 'error', name: e.name, message: e.message });
  }
}

/** A title and a next step a person can act on, for each way a run can fail. */
function explain(e: Error): [string, string | undefined] {
  if (e instanceof RendezvousError) {
    switch (e.code) {
      case 'SESSION_FULL':
        return ['Session full', 'Every rank of this session is taken. Create a new session, or wait for a tab to close.'];
      case 'WORLD_SIZE_MISMATCH':
        return ['World size disagrees with the session', 'Open the link exactly as it was shared.'];
      default:
        return ['Could not join the session', undefined];
    }
  }
  if (e instanceof UnauthorizedError) {
    return ['Wrong link for this session', 'This session is guarded by the secret in its link (#token=...). Open the full link the host shared; a shortened or retyped link cannot join.'];
  }
  if (e instanceof NonFiniteGradientError) return ['Training diverged', 'A gradient became NaN or infinite. Try a lower learning rate in a new session; if it persists, a tab of this session may be sending bad gradients.'];
  if (e instanceof ReplicaDivergenceError) return ['Replicas differ', 'The named ranks no longer hold the same weights as the others (a faulty or tampered tab). Start a new session without them.'];
  if (e instanceof MissingTokenError) return ['This link is not valid', 'Open the link exactly as it was shared, or create a new session on the start page.'];
  if (e instanceof ConfigMismatchError) return ['Configuration disagrees with the session', 'Open the link exactly as it was shared, or create a new session.'];
  if (e instanceof ConfigError) return ['This link is not valid', 'Open the link exactly as it was shared, or create a new session on the start page.'];
  if (e instanceof PeerLostError) return [`Rank ${e.rank} was lost`, 'The group cannot continue without it. Start a new session to train again.'];
  if (e instanceof ConnectionClosedError || e instanceof DistTimeoutError) return ['Server unreachable', 'Check that "npm start" is running on the host, then reload.'];
  return ['Training failed', undefined];
}
