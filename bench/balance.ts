/**
 * `npm run bench:balance`: DDP with a slow rank, with and without batches balanced by speed. Four
 * ranks train the same job (the train job, --dataset (synthetic) with --train-size samples,
 * --epochs, batch --batch-size per rank, Adam, --backend cpu) three ways:
 *   even      no straggler (the reference);
 *   torch     rank 3 four times slower (--slow 3:4), every rank the same batch (--balance false):
 *             the group moves at the straggler's pace, as torch's DDP does;
 *   balanced  rank 3 four times slower, each step's samples split by measured speed (the default).
 * Prints and writes bench/results/<--out>.json and .md: samples/s (the job's figure: per step,
 * the global batch over the step's time, step 1 left out), its ratio to `even`, seconds, and
 * whether the replicas stayed identical and every sample was trained once.
 *
 * Options: --dataset synthetic|mnist --train-size 8192 --batch-size 64 --epochs 1 --backend cpu --slow 3:4
 * --comm-hook SPEC (the train job's hook for all three, e.g. diloco:16: with balanced batches a slow
 * rank's inner steps get fewer samples and its pseudo-gradient weighs by them; default none),
 * --model mlp|cnn (default mlp)
 * --configs even,torch,balanced (a subset runs only those; `vs even` then needs even among them)
 * --out balance (the results' file name, .json and .md, in bench/results)
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { slowParam } from '../launcher/job_flags.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    dataset: { type: 'string', default: 'mnist' },
    'train-size': { type: 'string', default: '8192' },
    'batch-size': { type: 'string', default: '64' },
    epochs: { type: 'string', default: '1' },
    backend: { type: 'string', default: 'cpu' },
    slow: { type: 'string', default: '3:4' },
    configs: { type: 'string', default: 'even,torch,balanced' },
    out: { type: 'string', default: 'balance' },
    'comm-hook': { type: 'string', default: 'none' },
    model: { type: 'string', default: 'mlp' },
  },
});
if (!['synthetic', 'mnist'].includes(values.dataset!)) throw new Error(`--dataset: synthetic or mnist, got "${values.dataset}"`);
if (!/^[a-z0-9_-]{1,40}$/.test(values.out!)) throw new Error(`--out: a file name of a-z 0-9 _ - (no extension), got "${values.out}"`);
if (!['cpu', 'webgl', 'webgpu', 'wasm'].includes(values.backend!))
  throw new Error(`--backend: cpu, webgl, webgpu or wasm, got "${values.backend}"`);
for (const k of ['train-size', 'batch-size', 'epochs'] as const)
  if (!/^[1-9]\d{0,6}$/.test(values[k]!)) throw new Error(`--${k} takes a positive integer, got "${values[k]}"`);
if (!['mlp', 'cnn'].includes(values.model!)) throw new Error(`--model: mlp or cnn, got "${values.model}"`);
if (!/^[a-z0-9:.x]{1,60}$/.test(values['comm-hook']!))
  throw new Error(`--comm-hook takes a train job hook spec (e.g. none, diloco:16), got "${values['comm-hook']}"`);
if (!/^\d+:\d+(\.\d+)?$/.test(values.slow!)) throw new Error(`--slow takes RANK:FACTOR, got "${values.slow}"`);

const RANKS = 4;
const slow = slowParam([values.slow!], RANKS);
const wanted = values.configs!.split(',').map((c) => c.trim());
const all: Array<{ name: string; params: Record<string, string> }> = [
  { name: 'even', params: { balance: 'true' } },
  { name: 'torch', params: { balance: 'false', slow } },
  { name: 'balanced', params: { balance: 'true', slow } },
];
const configs = all.filter((c) => wanted.includes(c.name));
if (configs.length === 0) throw new Error(`--configs: some of even, torch, balanced, got "${values.configs}"`);

interface Row {
  name: string;
  ok: boolean;
  error?: string;
  samplesPerSec: number | null;
  seconds: number | null;
  identical: boolean | null;
  exactlyOnce: boolean | null;
  testAccuracy: number | null;
}
const rows: Row[] = [];
for (const c of configs) {
  const { ok, summary } = await launch({
    nproc: RANKS,
    job: 'train',
    session: `bench-balance-${c.name}-${Date.now().toString(36)}`,
    timeoutSec: 900,
    jobParams: {
      dataset: values.dataset!,
      trainSize: values['train-size']!,
      batchSize: values['batch-size']!,
      epochs: values.epochs!,
      backend: values.backend!,
      optimizer: 'adam',
      evalEvery: '0',
      commHook: values['comm-hook']!,
      model: values.model!,
      ...c.params,
    },
  });
  const s = summary as Record<string, unknown>;
  const num = (v: unknown) => (typeof v === 'number' ? v : null);
  const seen = s.samplesSeen as Array<{ exactlyOnce: boolean }> | undefined;
  rows.push({
    name: c.name,
    ok,
    ...(ok ? {} : { error: String((s.errors as string[] | undefined)?.[0] ?? 'failed') }),
    samplesPerSec: num(s.samplesPerSec),
    seconds: num(s.seconds),
    identical: typeof s.identical === 'boolean' ? s.identical : null,
    exactlyOnce: seen ? seen.every((e) => e.exactlyOnce) : null,
    testAccuracy: num(s.testAccuracy),
  });
  console.log(`bench:balance: ${c.name}: ${ok ? `${s.samplesPerSec} samples/s` : 'failed'}`);
}

const even = rows[0]?.samplesPerSec ?? null;
const date = new Date().toISOString().slice(0, 10);
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Debian Chromium headless, ${values.backend} backend`;
const md = [
  `# DDP${values['comm-hook'] === 'none' ? '' : ` with --comm-hook ${values['comm-hook']}`} with a slow rank: batches balanced by speed (${date})`,
  '',
  `Machine: ${machine}. ${RANKS} ranks, the train job on ${values.dataset} (${values['train-size']} samples, ${values.epochs} epoch(s)), ${values.model!.toUpperCase()}, batch ${values['batch-size']} per rank (global ${Number(values['batch-size']) * RANKS}), Adam; the straggler: \`--slow ${values.slow}\`.`,
  'Command: `npm run bench:balance` (options in bench/balance.ts).',
  '',
  '| run | samples/s | vs even | seconds | replicas identical | every sample once | test accuracy |',
  '| --- | ---: | ---: | ---: | --- | --- | ---: |',
  ...rows.map((r) =>
    r.ok
      ? `| ${r.name} | ${r.samplesPerSec?.toFixed(0)} | ${even && r.samplesPerSec ? (r.samplesPerSec / even).toFixed(2) : ''} | ${r.seconds?.toFixed(1)} | ${r.identical} | ${r.exactlyOnce} | ${r.testAccuracy?.toFixed(3) ?? ''} |`
      : `| ${r.name} | failed: ${r.error} | | | | | |`,
  ),
  '',
].join('\n');
console.log(md);
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(join(dir, `${values.out}.json`), JSON.stringify({ date, machine, options: values, rows }, null, 2));
await writeFile(join(dir, `${values.out}.md`), md);
process.exit(rows.every((r) => r.ok) ? 0 : 1);
