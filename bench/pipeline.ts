/**
 * `npm run bench:pipeline`: the pipeline's bubble, measured. For each configuration (model,
 * stages S, micro-batches M, schedule) the launcher trains a few steps and every stage reports
 * the idle share of its step (1 - its compute time / its step time); the table puts the mean over
 * the stages beside the formula (S-1)/(M+S-1), with the step time and each stage's own share.
 * Writes bench/results/pipeline.json and pipeline.md and prints the table.
 *
 * Options: --configs "mlp:2:1,mlp:2:4:1f1b,cnn:2:4:gpipe:1,..." (model:stages:micro-batches[:schedule[:split
 * points, / between them]]),
 * --steps (10), --batch-size (32 for mlp, 64 for cnn).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    configs: { type: 'string', default: 'mlp:2:1,mlp:2:2,mlp:2:4,mlp:2:8,mlp:2:8:1f1b,cnn:2:1,cnn:2:4,cnn:2:4:gpipe:1,cnn:3:4' },
    steps: { type: 'string', default: '10' },
    'batch-size': { type: 'string' },
  },
});

interface StageFigures {
  stage: number;
  layerClasses: string[];
  parameters: number;
  bubble: number | null;
  breakdownMs: { compute: number | null; waitActivations: number | null; waitGradients: number | null };
}

interface Row {
  model: string;
  dataset: string;
  stages: number;
  microBatches: number;
  schedule: string;
  splitPoints: string | null;
  batchSize: number;
  stepMs: number;
  measured: number;
  formula: number;
  perStage: Array<{ stage: number; layers: string; parameters: number; bubble: number | null; computeMs: number | null }>;
}

const rows: Row[] = [];
for (const config of values.configs!.split(',')) {
  const [model, s, m, schedule = 'gpipe', split] = config.split(':');
  const splitPoints = split ? split.replaceAll('/', ',') : undefined;
  const stages = Number(s);
  const microBatches = Number(m);
  // The synthetic set for the small MLP (2 layers), MNIST for the CNN (6 layers, up to 3 stages with weights).
  const dataset = model === 'cnn' ? 'mnist' : 'synthetic';
  const batchSize = Number(values['batch-size'] ?? (model === 'cnn' ? 64 : 32));
  console.log(
    `--- ${model} on ${dataset}: ${stages} stages x ${microBatches} micro-batches, ${schedule}, batch ${batchSize}${splitPoints ? `, split at ${splitPoints}` : ''}`,
  );
  const { ok, summary } = await launch({
    nproc: stages,
    job: 'train',
    session: `bench-pp-${model}-${stages}-${microBatches}-${schedule}-${Date.now().toString(36)}`,
    timeoutSec: 900,
    jobParams: {
      model,
      dataset,
      optimizer: 'sgd',
      steps: values.steps!,
      'batch-size': String(batchSize),
      pp: String(stages),
      'micro-batches': String(microBatches),
      schedule,
      'eval-every': '100000',
      'train-size': '4096',
      'test-size': '500',
      ...(splitPoints ? { 'split-points': splitPoints } : {}),
    },
    log: (line) => console.log(line),
  });
  if (!ok) {
    console.error(JSON.stringify(summary));
    process.exit(1);
  }
  const sum = summary as unknown as {
    samplesPerSec: number;
    pipeline: { bubble: { measured: number; formula: number }; stages: StageFigures[] };
  };
  const round = (x: number | null, digits = 2) => (x === null ? null : Math.round(x * 10 ** digits) / 10 ** digits);
  rows.push({
    model,
    dataset,
    stages,
    microBatches,
    schedule,
    splitPoints: splitPoints ?? null,
    batchSize,
    stepMs: round((batchSize / sum.samplesPerSec) * 1000, 1)!,
    measured: round(sum.pipeline.bubble.measured)!,
    formula: round(sum.pipeline.bubble.formula)!,
    perStage: sum.pipeline.stages.map((st) => ({
      stage: st.stage,
      layers: st.layerClasses.join('+'),
      parameters: st.parameters,
      bubble: round(st.bubble),
      computeMs: round(st.breakdownMs.compute, 1),
    })),
  });
}

const date = new Date().toISOString().slice(0, 10);
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Chromium headless, WebGPU on SwiftShader, loopback WebRTC`;
const pct = (x: number | null) => (x === null ? '-' : `${Math.round(x * 100)}%`);
const lines = [
  `Pipeline bubble, one replica, ${values.steps} SGD steps (the first left out), ${date}, ${machine}.`,
  '',
  '| model | stages | micro-batches | schedule | split | step ms | bubble measured (mean of stages) | formula (S-1)/(M+S-1) | per stage: layers, compute ms, bubble |',
  '| --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  ...rows.map(
    (r) =>
      `| ${r.model} (${r.dataset}, batch ${r.batchSize}) | ${r.stages} | ${r.microBatches} | ${r.schedule} | ${r.splitPoints ?? 'balanced by parameters'} | ${r.stepMs} | ${pct(r.measured)} | ${pct(r.formula)} | ${r.perStage.map((p) => `${p.stage}: ${p.layers}, ${p.computeMs} ms, ${pct(p.bubble)}`).join('; ')} |`,
  ),
  '',
  "A stage's bubble is the share of its step it was not computing (1 - compute / step). The formula assumes every pass takes the same time on every stage and that sending an activation costs nothing.",
];
const table = lines.join('\n');
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(join(dir, 'pipeline.json'), `${JSON.stringify({ date, machine, steps: Number(values.steps), rows }, null, 2)}\n`);
await writeFile(join(dir, 'pipeline.md'), `${table}\n`);
console.log(`\n${table}`);
