/**
 * Demo harness: mounts the Dashboard and replays a synthetic but realistic run of 3 ranks as
 * seen from rank 1's tab. `npx vite --port 5199`, then http://localhost:5199/client/ui/demo.html
 *
 * URL parameters:
 *   view=create          the create form instead of the dashboard
 *   until=N | until=end  replay instantly up to step N (or everything) and stop (for screenshots)
 *   speed=S              steps per second when replaying live (default 12)
 *   scenario=lost        rank 2 disappears at step 140 (error banner, greyed node, failed run)
 *   scenario=fallback    this tab has no WebGPU and runs on wasm
 *   scenario=waiting     stop while waiting for the last tab
 *   world=N              number of ranks (default 3; this tab is rank 1)
 *   steps=N              number of steps (default 200)
 */
import type { RankStepMetrics, TrainConfig, TrainEvent } from '../train/events.ts';
import { Dashboard } from './dashboard.ts';
import { mountCreateForm } from './create_form.ts';
import '../style.css';

const params = new URLSearchParams(location.search);
const app = document.getElementById('app')!;

/** Deterministic noise so screenshots are reproducible. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

type Action = { delayMs: number; event?: TrainEvent; run?: (d: Dashboard) => void; step?: number };

const WORLD = Math.max(1, Math.min(32, Number(params.get('world') ?? 3)));
const SELF = Math.min(1, WORLD - 1);
const STEPS = Math.max(1, Number(params.get('steps') ?? 200));

function buildScript(scenario: string | null): Action[] {
  const rand = mulberry32(42);
  const gauss = () => Math.sqrt(-2 * Math.log(rand() + 1e-12)) * Math.cos(2 * Math.PI * rand());
  const config: TrainConfig = {
    model: 'cnn',
    dataset: 'mnist',
    batchSize: 100,
    lr: 0.001,
    optimizer: 'adam',
    epochs: 1,
    steps: null,
    seed: 0,
    shuffle: true,
    backend: 'webgpu',
    worldSize: WORLD,
    elastic: null,
    checkpointEvery: 0,
    evalEvery: 50,
    resumeFrom: null,
  };
  const a: Action[] = [];
  const push = (delayMs: number, event: TrainEvent, step?: number) => a.push({ delayMs, event, step });

  push(0, { type: 'config', config });
  if (scenario === 'fallback') {
    push(300, { type: 'joined', rank: SELF, worldSize: WORLD, backend: 'wasm', adapter: null, fallbackReason: 'WebGPU is not available in this browser (navigator.gpu is undefined)' });
    a.push({
      delayMs: 0,
      run: (d) =>
        d.showError(
          'No WebGPU in this tab: training on WebAssembly (wasm) instead',
          'This browser did not provide a WebGPU adapter, so this rank computes on the CPU with wasm. It will be slower, and every other rank waits for it at each all-reduce.',
          'Open the link in a recent Chrome or Edge (113+) with hardware acceleration on, or keep going if speed does not matter.',
        ),
    });
  } else {
    push(300, { type: 'joined', rank: SELF, worldSize: WORLD, backend: 'webgpu', adapter: 'NVIDIA GeForce RTX 3060 (Vulkan)' });
  }
  // Tabs arrive one by one, this one first; the last one is missing in the 'waiting' scenario.
  const order = [SELF, ...Array.from({ length: WORLD }, (_, r) => r).filter((r) => r !== SELF)];
  for (let k = 1; k <= WORLD; k++) {
    if (scenario === 'waiting' && k === WORLD && WORLD > 1) return a;
    push(k === 1 ? 0 : 900, { type: 'waiting', joined: order.slice(0, k).sort((x, y) => x - y), worldSize: WORLD });
  }
  // This tab's ring neighbours: it receives from SELF-1 and sends to SELF+1 (the same peer for two ranks).
  const peers = [...new Set([(SELF + WORLD - 1) % WORLD, (SELF + 1) % WORLD])].filter((p) => p !== SELF);
  const mbps = [48.6, 31.2];
  for (const p of peers) push(100, { type: 'link', peer: p, state: 'connecting' });
  for (const p of peers) push(500, { type: 'link', peer: p, state: 'open' });
  peers.forEach((p, k) => push(400, { type: 'link', peer: p, state: 'open', throughputMBps: mbps[k] }));
  push(200, { type: 'shard', epoch: 0, samples: Math.ceil(60000 / WORLD), datasetSize: 60000, stepsPerEpoch: STEPS });

  const testAcc = (step: number) => 0.975 - 0.55 * Math.exp(-step / 33);
  const testLoss = (step: number) => 0.08 + 1.5 * Math.exp(-step / 38);
  // Rank 2 has a slower GPU: it computes longer and the other two wait for it in the all-reduce.
  const computeMs = Array.from({ length: WORLD }, (_, r) => (r === 2 ? 49 : 31 + ((r * 7) % 5)));
  let elapsed = 0;
  const lostAt = scenario === 'lost' ? 140 : Infinity;
  for (let step = 1; step <= STEPS; step++) {
    const ranks: RankStepMetrics[] = [];
    const compute = computeMs.map((c) => c * (1 + 0.08 * gauss()) + (step === 1 ? 400 : 0));
    const slowest = Math.max(...compute);
    for (let r = 0; r < WORLD; r++) {
      const base = 2.2 * Math.exp(-step / 38) + 0.09 + 0.05 * Math.exp(-step / 400);
      const loss = Math.max(0.01, base * (1 + 0.22 * gauss()));
      const accTrue = 1 - 0.88 * Math.exp(-step / 30) - 0.025;
      const accuracy = Math.round(100 * Math.min(1, Math.max(0, accTrue + 0.035 * gauss()))) / 100;
      const breakdownMs = { compute: compute[r]!, readback: 3.5 + rand() * 1.5, allreduce: 14 + 3 * rand() + (slowest - compute[r]!), apply: 2.2 + rand() };
      const total = breakdownMs.compute + breakdownMs.readback + breakdownMs.allreduce + breakdownMs.apply;
      ranks.push({ rank: r, loss, accuracy, samplesPerSec: (config.batchSize * 1000) / total, breakdownMs });
    }
    elapsed += (slowest + 24) / 1000;
    if (step === lostAt) {
      // What the trainer emits when a peer dies mid-step; then its promise rejects and the page calls fail().
      push(0, { type: 'link', peer: 2, state: 'closed' }, step);
      push(0, { type: 'log', level: 'error', message: 'Lost rank 2: the data channel closed' }, step);
      a.push({
        delayMs: 300,
        step,
        run: (d) =>
          d.fail(
            'Rank 2 was lost',
            `Rank 2's tab closed or lost its network connection at step ${step}. The ring all-reduce needs every rank, so training cannot continue.`,
            'Open a new session and share its link again; the trained steps so far are lost.',
          ),
      });
      return a;
    }
    push(-1, { type: 'step', epoch: 0, step, totalSteps: STEPS, ranks, elapsedSec: elapsed }, step);
    if (step === 120 && WORLD > 2) push(0, { type: 'log', level: 'warn', message: 'Rank 2 is about 45% slower than the other ranks; the others wait for it at every all-reduce.' }, step);
    if (step === 100) peers.forEach((p, k) => push(0, { type: 'link', peer: p, state: 'open', throughputMBps: [52.3, 29.8][k]! }, step));
    if (step % 50 === 0 || step === STEPS) {
      elapsed += 0.9;
      push(0, { type: 'eval', epoch: 0, step, testAccuracy: testAcc(step), testLoss: testLoss(step) }, step);
    }
  }
  push(400, { type: 'done', summary: summary(STEPS, elapsed, testAcc(STEPS), testLoss(STEPS)) }, STEPS + 1);
  return a;
}

/** The same shape as client/train/trainer.ts's summary (minus the per-sample lists). */
function summary(steps: number, seconds: number, testAccuracy: number, testLoss: number, stoppedBy?: number): Record<string, unknown> {
  return {
    rank: SELF,
    worldSize: WORLD,
    backend: 'webgpu',
    model: 'cnn',
    dataset: 'mnist',
    steps,
    epochs: 1,
    samplesPerSec: 4215.7,
    finalLoss: 0.1275,
    testAccuracy,
    testLoss,
    weightHash: '9f3c2a71',
    breakdownMs: { compute: 37.9, readback: 4.2, allreduce: 26.1, apply: 2.7 },
    seconds,
    samplesSeenPerEpoch: [steps * 100],
    numTensors: [52, 52, 52],
    ...(stoppedBy !== undefined ? { stoppedBy } : {}),
  };
}

function runDashboard(): void {
  const scenario = params.get('scenario');
  const untilRaw = params.get('until');
  const until = untilRaw === null ? null : untilRaw === 'end' ? Infinity : Number(untilRaw);
  const speed = Number(params.get('speed') ?? 12);
  let timer: ReturnType<typeof setTimeout> | undefined;
  let halted = false;

  const shareUrl = `${location.origin}/?session=demo-run&world=3&job=train&model=cnn&dataset=mnist&batchSize=100&lr=0.001&optimizer=adam&epochs=1&backend=webgpu`;
  const dash: Dashboard = new Dashboard(app, {
    session: 'demo-run',
    shareUrl,
    onStop: () => {
      halted = true;
      clearTimeout(timer);
      // The trainer allGathers the stop flag with the next step, reports who stopped, evaluates, then 'done'.
      setTimeout(() => dash.handle({ type: 'stopped', by: SELF, atStep: lastStep }), 300);
      setTimeout(() => dash.handle({ type: 'done', summary: summary(lastStep, lastElapsed + 1, 0.9312, 0.2241, SELF) }), 1300);
    },
    onDownload: () => dash.handle({ type: 'log', level: 'info', message: 'Demo: the model download would start now.' }),
  });

  const script = buildScript(scenario);
  let lastStep = 0;
  let lastElapsed = 0;
  const apply = (x: Action) => {
    if (x.event) {
      if (x.event.type === 'step') {
        lastStep = x.event.step;
        lastElapsed = x.event.elapsedSec;
      }
      dash.handle(x.event);
    }
    x.run?.(dash);
  };

  let i = 0;
  const t0 = performance.now();
  if (until !== null) {
    for (; i < script.length; i++) {
      const x = script[i]!;
      if (x.step !== undefined && x.step > until) break;
      apply(x);
    }
    document.documentElement.dataset.demoReady = 'true';
    document.documentElement.dataset.replayMs = String(Math.round(performance.now() - t0));
    return;
  }
  const next = () => {
    if (halted || i >= script.length) {
      document.documentElement.dataset.demoReady = 'true';
      return;
    }
    const x = script[i++]!;
    apply(x);
    const following = script[i];
    const delay = following ? (following.delayMs < 0 ? 1000 / speed : following.delayMs) : 0;
    timer = setTimeout(next, delay);
  };
  next();
}

if (params.get('view') === 'create') mountCreateForm(app, { origin: location.origin });
else runDashboard();
