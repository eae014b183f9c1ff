/**
 * The training page: the dashboard, the trainer, and the controls that connect them. Humans and
 * the launcher's headless ranks use the same page; the launcher also gets reports.
 */
import type * as tf from '@tensorflow/tfjs';
import {
  ConnectionClosedError,
  DistTimeoutError,
  RemovedByHostError,
  RendezvousClosedError,
  RendezvousError,
  StoreClient,
  type RendezvousEvent,
} from '../../src/index.ts';
import { pageHostSecret, pageToken } from '../page_token.ts';
import { mountBadLink } from '../ui/bad_link.ts';
import { refusedLinkProblem, tokenProblem, type LinkProblem } from '../ui/link_check.ts';
import { PageSecret } from './page_secret.ts';
import { DashboardPublisher, watchDashboard } from '../train/spectator.ts';
import { Dashboard } from '../ui/dashboard.ts';
import { report, reportElasticEvents } from '../report.ts';
import { parseTrainConfig, urlOption, type TrainConfig } from '../../src/jobs/train_config.ts';
import { train } from '../train/trainer.ts';
import type { TrainResult } from '../train/harness.ts';
import type { TrainEvent } from '../train/events.ts';
import { sampleWeighted } from '../ui/sample_weighted.ts';
import { downloadModel, downloadTorchModel } from '../train/download.ts';
import { probeText } from '../backend_figures.ts';
import { installDeviceLossHook } from '../device_hook.ts';
import { preflight, tabAbilities } from '../train/preflight.ts';
import { browserLabel, thisBrowser } from '../user_agent.ts';
import { explain } from './failure_advice.ts';
import { capturePictures } from './local_pictures.ts';

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
      return `rank ${e.rank}/${e.worldSize} on ${e.backend}${e.adapter ? ` (${e.adapter})` : ''}${e.fallbackReason ? `: ${e.fallbackReason}` : ''}${e.probe ? `; auto, measured: ${probeText(e.probe, e.backend)}` : ''}`;
    case 'step': {
      if (e.step !== 1 && e.step % logEvery !== 0 && e.step !== e.totalSteps) return undefined;
      // The global batch's loss: weighted by each rank's samples (a rank given none has no loss).
      const loss = sampleWeighted(e.ranks, 'loss');
      return `epoch ${e.epoch + 1} step ${e.step}/${e.totalSteps} loss ${loss === null ? '–' : loss.toFixed(4)}`;
    }
    case 'eval':
      return `epoch ${e.epoch + 1} step ${e.step}: test accuracy ${(e.testAccuracy * 100).toFixed(2)}%, test loss ${e.testLoss.toFixed(4)}`;
    case 'sample':
      return `step ${e.step}: the model writes ${JSON.stringify(e.prompt + e.text)}`;
    case 'local-eval':
      return `step ${e.step}: accuracy on held-out pictures: this tab ${e.own.correct}/${e.own.count}, the group ${e.group.correct}/${e.group.count}`;
    case 'log':
      return `${e.level}: ${e.message}`;
    case 'store':
      return e.unavailable === null
        ? "info: the session's store answers again"
        : `warn: the session's store is unavailable (${e.unavailable}); retrying`;
    case 'shard':
      return `epoch ${e.epoch + 1}: ${e.samples} of ${e.datasetSize} samples on this rank, ${e.stepsPerEpoch} steps`;
    case 'stopped':
      return `stopped by rank ${e.by} at step ${e.atStep}`;
    case 'rank-lost':
      return `lost rank ${e.rank}: ${e.reason}`;
    case 'pipeline': {
      const mine = e.layers.filter((l) => l.stage === e.stage);
      const params = mine.reduce((n, l) => n + l.parameters, 0);
      return `pipeline stage ${e.stage} of ${e.stages}${e.replicas > 1 ? ` in replica ${e.replica} of ${e.replicas}` : ''}: layers ${mine.map((l) => `${l.index} ${l.className}`).join(', ')} (${params} parameters); ${e.schedule}, ${e.microBatches} micro-batches, bubble by the formula ${(e.bubbleFormula * 100).toFixed(1)}%`;
    }
    case 'devices':
      return e.devices.some((d) => d.steps !== undefined)
        ? undefined
        : `devices: ${e.devices.map((d) => `${d.device} on ${d.backend}${d.fallbackReason ? ` (${d.fallbackReason})` : ''}`).join(', ')}`;
    case 'timeline':
    case 'fleet': // the dashboard says it once the group's tabs are known
    case 'ps': // about once a second: the dashboard shows it, the console would drown in it
    case 'aggregation': // every step: the dashboard's table shows it, refusals are logged apart
    case 'steps-redone': // the run's own figure, in its summary
    case 'config':
    case 'local-counts': // the dashboard's table shows them
    case 'waiting':
    case 'link':
    case 'done':
    case 'evaluating': // the dashboard shows its progress
      return undefined;
    default: {
      const unknown: never = e;
      return String(unknown);
    }
  }
}

/** Connects to the server, retrying with backoff (and saying so) while it is unreachable. */
async function connectWithRetry(
  dash: Dashboard,
  origin: string,
  session: string,
  token: string,
  host: string | undefined,
  timeoutMs: number,
): Promise<StoreClient> {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 0; ; attempt++) {
    try {
      const store = await StoreClient.connect(origin, { session, token, timeoutMs, ...(host === undefined ? {} : { host }) });
      dash.clearError();
      return store;
    } catch (err) {
      if (!(err instanceof ConnectionClosedError || err instanceof DistTimeoutError) || Date.now() > deadline) throw err;
      const wait = Math.min(15_000, 1000 * 2 ** attempt);
      dash.showError(
        'Server unreachable',
        `Could not reach the training server at ${origin}.`,
        `Retrying in ${Math.round(wait / 1000)} s. Check that "npm start" is running on the host.`,
      );
      await new Promise((r) => setTimeout(r, wait));
    }
  }
}

/** A tab whose link cannot join the session: one page says what is wrong and what to do, nothing else. */
function showBadLink(root: HTMLElement, session: string, problem: LinkProblem): void {
  root.replaceChildren();
  mountBadLink(root, problem);
  document.title = `⚠ ${problem.title} · ${session}`;
  console.error(`${problem.title}: ${problem.message}`);
  // The launcher's pages must hear of it too, or it would wait for a result until its timeout.
  report({ type: 'error', name: 'LinkError', message: problem.message });
}

/**
 * What the page knows of its run, shared by the dashboard's controls, the trainer's callbacks and
 * the explanation of a failure.
 */
interface PageRun {
  stop: boolean;
  result?: TrainResult;
  /** This tab's replica, from the moment it exists: it can be saved even when the run fails. */
  liveModel?: tf.LayersModel;
  /** A language model's vocabulary (its downloads carry it, so ids turn back into characters). */
  liveVocabulary?: readonly string[];
  store?: StoreClient;
  config?: TrainConfig;
  /** The evaluation after the run is running here; and whether it is to be skipped (see onSkipEval). */
  evaluatingFinal: boolean;
  skipEval: boolean;
  rank: number;
  /** When this tab first joined a round (performance.now()): the time limit counts from there. */
  joinedAt?: number;
  timeUp: boolean;
  publisher?: DashboardPublisher;
  /** The shared dashboard this tab shows while it spectates. */
  watcher?: { stop(): void };
}

export async function trainPage(opts: TrainPageOptions): Promise<void> {
  const { root, params, session } = opts;
  // A link without a token, or with one of the wrong form, joins nothing: no dashboard, no "failed".
  const badToken = tokenProblem(location.hash, session);
  if (badToken) return showBadLink(root, session, badToken);
  root.removeAttribute('aria-live'); // the dashboard manages its own live regions
  const run: PageRun = { stop: false, evaluatingFinal: false, skipEval: false, rank: -1, timeUp: false };
  // Checked above: tokenProblem found none.
  const token = pageToken();
  const hostSecret = pageHostSecret();
  // The token changes when the host removes a tab; the removed tab stops, says so, and keeps its replica to save.
  const secret = new PageSecret(token, {
    linkChanged: (next, reason) => dash.linkChanged(next, reason),
    removed: () => {
      run.stop = true;
      document.title = `removed · ${session} · Browser DDP`;
      dash.removed();
      if (run.liveModel) dash.setDownloadable(true);
    },
  });
  const dash = pageDashboard(root, session, run);
  const events = pageEvents(dash, session, run, Math.max(1, Number(params.get('logEvery') ?? 20)));
  reportElasticEvents();
  installDeviceLossHook();
  watchThrottling((message) => events.emit({ type: 'log', level: 'warn', message }));
  try {
    await runTraining(opts, dash, run, secret, events, token, hostSecret);
  } catch (err) {
    run.watcher?.stop();
    showFailure(root, session, dash, run, secret, err);
  }
}

/** The dashboard with its controls: the host's actions go through the server, to every tab. */
function pageDashboard(root: HTMLElement, session: string, run: PageRun): Dashboard {
  /** Asks the server to pass the host's action to every tab; only the host's tab offers these. */
  const control = (action: 'stop' | 'end' | 'min', min?: number) => {
    if (!run.store) return;
    run.store
      .control(action, min)
      .catch((err: Error) =>
        dash.showError('The session did not take this', err.message, 'Reload this tab (it rejoins as the host) and try again.'),
      );
  };
  const dash: Dashboard = new Dashboard(root, {
    session,
    shareUrl: location.href,
    onStop: () => {
      // A session with a host stops when the host says so, through the server, to every tab at once.
      if (run.store?.hasHost) control('stop');
      else run.stop = true;
    },
    // With a host, a second 'stop' (relayed to every tab) skips the evaluation after the run on every rank at once.
    onSkipEval: () => {
      if (run.store?.hasHost) control('stop');
      else run.skipEval = true;
    },
    onEnd: () => control('end'),
    onSetMin: (min) => control('min', min),
    // The server changes the session's token and tells every other tab; the removed one is closed.
    onRemove: (target) => {
      run.store
        ?.removeMember(target)
        .catch((err: Error) =>
          dash.showError(
            'The tab was not removed',
            err.message,
            "Look at the group's tabs again and try again; if this tab lost its connection, reload it (it rejoins as the host).",
          ),
        );
    },
    // This tab rejoins the session: it takes the state of the live replicas, or the latest checkpoint.
    onContinue: () => location.reload(),
    onDownload: (baseName) => {
      const model = run.result?.model ?? run.liveModel;
      if (!model) return;
      downloadModel(model, baseName, run.liveVocabulary).then(
        () => console.log(`model downloaded: ${baseName}.json + ${baseName}.weights.bin`),
        (err: Error) => {
          console.error(`download failed: ${err.message}`);
          dash.showError('Download failed', err.message);
        },
      );
    },
    onDownloadTorch: (baseName) => {
      const model = run.result?.model ?? run.liveModel;
      if (!model) return;
      downloadTorchModel(model, baseName, run.liveVocabulary).then(
        () => console.log(`model downloaded for PyTorch: ${baseName} (.safetensors + .py)`),
        (err: Error) => {
          console.error(`download for PyTorch failed: ${err.message}`);
          dash.showError('Download for PyTorch failed', err.message);
        },
      );
    },
  });
  return dash;
}

/** Where the run's events go: the page's (dashboard, title, console, reports), the trainer's, and the time limit. */
interface PageEvents {
  emit(e: TrainEvent): void;
  /** The trainer's events: the page's, and the first 'joined' starts the time limit's clock. */
  trainerEmit(e: TrainEvent): void;
  /** True (and said once) once `timeLimit` seconds have passed since this tab first joined. */
  timeLimitReached(): boolean;
}

function pageEvents(dash: Dashboard, session: string, run: PageRun, logEvery: number): PageEvents {
  const emit = (e: TrainEvent) => {
    dash.handle(e);
    showInTitle(session, e);
    if (e.type === 'joined') run.rank = e.rank;
    if (e.type === 'evaluating') run.evaluatingFinal = true;
    // Rank 0 shows the run to the spectators of a full session.
    run.publisher?.record(e, run.rank === 0);
    const line = logLine(e, logEvery);
    if (line) console.log(line);
    if (e.type === 'joined') report({ type: 'rank', rank: e.rank, worldSize: e.worldSize });
  };
  return {
    emit,
    trainerEmit: (e) => {
      if (e.type === 'joined' && run.joinedAt === undefined) run.joinedAt = performance.now();
      emit(e);
    },
    timeLimitReached: () => {
      if (run.timeUp) return true;
      const limit = run.config?.timeLimit ?? null;
      if (limit === null || run.joinedAt === undefined || performance.now() - run.joinedAt < limit * 1000) return false;
      run.timeUp = true;
      emit({ type: 'log', level: 'info', message: `Time limit of ${limit} s reached: stopping.` });
      return true;
    },
  };
}

/** Reads the configuration, connects, trains, and reports the result; throws what went wrong. */
async function runTraining(
  opts: TrainPageOptions,
  dash: Dashboard,
  run: PageRun,
  secret: PageSecret,
  events: PageEvents,
  token: string,
  hostSecret: string | undefined,
): Promise<void> {
  const { params, session } = opts;
  const config = parseTrainConfig((name) => urlOption(params, name));
  run.config = config;
  // A tab that cannot take part says why before it joins anything: the others never wait for it.
  const refusal = preflight(config, tabAbilities(browserLabel(thisBrowser())));
  if (refusal) throw refusal;
  const flags = { checkWeights: params.get('checkWeights') === 'true', returnWeights: params.get('returnWeights') === 'true' };
  // Each tab's own pictures: taken here first; the tab connects only once the person joins.
  const localData = config.local ? await capturePictures(opts.root, config.local, session, dash) : undefined;
  const connected = await connectWithRetry(dash, location.origin, session, token, hostSecret, opts.timeoutMs);
  run.store = connected;
  // The first connection's events; the rendezvous handler's onToken follows the later ones.
  secret.watch(connected);
  listenForStops(connected, run);
  const role = { host: connected.isHost, hasHost: connected.hasHost };
  dash.setRole({ ...role, spectator: false });
  run.publisher = new DashboardPublisher(connected);
  const result = await train({
    serverUrl: location.origin,
    store: connected,
    session,
    // Read at each use (checkpoints, the host's data): the host's removal of a tab changes it.
    get token() {
      return secret.token;
    },
    onToken: (next) => secret.changed(next),
    rank: opts.rank,
    timeoutMs: opts.timeoutMs,
    config,
    flags,
    emit: events.trainerEmit,
    // Every rank asks to stop at its time limit too: DDP stops at the next step boundary, a PS run when server 0 next answers a worker.
    stopRequested: () => run.stop || events.timeLimitReached(),
    // With a host, a stop counts only when every rank heard it from the server: no member stops the run alone.
    stopVote: connected.hasHost ? 'all' : 'any',
    skipEvaluation: () => run.skipEval,
    ...(hostSecret === undefined ? {} : { host: hostSecret }),
    spectate: true,
    onModel: (model, vocabulary) => {
      run.liveModel = model;
      run.liveVocabulary = vocabulary;
    },
    onRendezvous: (e) => onRendezvousEvent(e, dash, run, session, connected, role),
    ...(localData ? { localData } : {}),
  });
  run.result = result;
  // For tests: what the page's model predicts on the first test samples.
  const probe = { inputs: Array.from(result.probe.inputs), inputShape: result.probe.inputShape, logits: Array.from(result.probe.logits) };
  (window as unknown as { __ddpModel?: tf.LayersModel }).__ddpModel = result.model;
  report({ type: 'result', result: { ...result.summary, probe } });
}

/**
 * Heard on the connection itself, which outlives the rendezvous: the skip comes after the run.
 * The first 'stop' stops the training; one during the evaluation after the run, or any later one, skips it.
 */
function listenForStops(connected: StoreClient, run: PageRun): void {
  let stopHeard = false;
  connected.on('control', (e) => {
    if (e.action !== 'stop') return;
    if (run.evaluatingFinal || stopHeard) run.skipEval = true;
    stopHeard = true;
  });
}

/** The rendezvous' events the page shows: spectating (the shared dashboard), rounds, faults, the host's controls. */
function onRendezvousEvent(
  e: RendezvousEvent,
  dash: Dashboard,
  run: PageRun,
  session: string,
  connected: StoreClient,
  role: { host: boolean; hasHost: boolean },
): void {
  if (e.type === 'spectating') {
    document.title = `watching · ${session} · Browser DDP`;
    dash.setRole({ ...role, spectator: true });
    run.watcher ??= watchDashboard(connected, (shared) => dash.handle(shared));
  } else if (e.type === 'round') {
    run.watcher?.stop();
    run.watcher = undefined;
  } else if (e.type === 'faults') {
    dash.faultHistory(e.counts, e.entries);
  } else if (e.type === 'control') {
    dash.controlEvent(e.action, e.min);
    if (e.action === 'stop' || e.action === 'end') run.stop = true;
  }
}

/** Says how the run ended when it did not end well: what happened, what to do, and whether the replica can be saved. */
function showFailure(root: HTMLElement, session: string, dash: Dashboard, run: PageRun, secret: PageSecret, err: unknown): void {
  const e = err instanceof Error ? err : new Error(String(err));
  console.error(`${e.name}: ${e.message}`);
  report({ type: 'error', name: e.name, message: e.message });
  if (e instanceof RemovedByHostError || secret.removed) {
    // Not a failure: the host chose to. The replica it trained stays here to save.
    secret.markRemoved();
    return;
  }
  if (e instanceof RendezvousClosedError) {
    // The run ended well while this tab watched or waited, or as its last round failed here
    // while the others finished it: not a failure of training. Its replica can still be saved.
    dash.watchedEnd(e.rank);
    if (e.rank !== null && run.liveModel) dash.setDownloadable(true);
    return;
  }
  // Refused before it ever joined (a wrong, replaced or unknown token, an ended session): not a member, so no dashboard.
  const refused = run.joinedAt === undefined ? refusedLinkProblem(e, session) : null;
  if (refused) {
    dash.destroy();
    showBadLink(root, session, refused);
    return;
  }
  if (e instanceof RendezvousError && e.code === 'SESSION_FULL') {
    // Even the spectators' seats are taken: not a failure of training.
    dash.full(run.config?.max ?? null);
    return;
  }
  const config = run.config;
  const [title, action, canContinue] = explain(e, config !== undefined && config.min === config.max);
  document.title = `⚠ ${title} · ${session}`;
  // Whatever happened, this tab's replica is still here to save.
  if (run.liveModel) dash.setDownloadable(true);
  dash.fail(title, e.message, action, { canContinue: canContinue && run.liveModel !== undefined });
}

/** The step and state in the tab's title, so that the tab strip shows progress. */
function showInTitle(session: string, e: TrainEvent): void {
  if (e.type === 'step') document.title = `${e.step}/${e.totalSteps} · ${session} · Browser DDP`;
  else if (e.type === 'done') document.title = `✓ done · ${session} · Browser DDP`;
  else if (e.type === 'waiting') document.title = `${e.paused ? 'paused' : 'waiting'} · ${session} · Browser DDP`;
}

/**
 * Warns when the browser is likely to slow this tab: after a long time in the background, or on
 * a low battery (battery savers throttle pages). Training goes on; the user learns why it is slow.
 */
function watchThrottling(warn: (message: string) => void): void {
  let hiddenSince: number | undefined;
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'hidden') {
      hiddenSince = Date.now();
      return;
    }
    const minutes = hiddenSince === undefined ? 0 : (Date.now() - hiddenSince) / 60_000;
    hiddenSince = undefined;
    if (minutes >= 5) {
      warn(
        `This tab was in the background for ${Math.round(minutes)} min. Browsers slow background tabs down; for full speed keep it in a window of its own that stays visible.`,
      );
    }
  });
  const battery = (navigator as { getBattery?: () => Promise<{ charging: boolean; level: number }> }).getBattery;
  battery?.call(navigator).then(
    (b) => {
      if (!b.charging && b.level < 0.2)
        warn(`The battery is at ${Math.round(b.level * 100)}%: a battery saver may slow this tab. Plug the computer in for full speed.`);
    },
    () => {},
  );
}
