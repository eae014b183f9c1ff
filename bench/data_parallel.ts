/**
 * `npm run bench:data-parallel`: DataParallel inside one tab on this machine. One rank trains the
 * same job (MNIST, the first --train-size samples, one epoch, batch --batch-size, adam) with
 * --devices 1 (the page's own thread computes), 2 and 4 (that many Workers, each a replica on
 * its own backend), per backend (cpu, wasm, webgpu) and model (mlp; cnn on cpu and webgpu, since
 * TF.js's wasm backend cannot train convolutions). Prints and writes
 * bench/results/data_parallel.json and .md: samples/s, the step's time, each device's compute
 * per step and the backends the devices ran. A run that fails is recorded and the others go on;
 * the exit code is then 1.
 *
 * Options: --backends cpu,wasm,webgpu --devices 1,2,4 --models mlp,cnn --batch-size 128
 * --train-size 4096 (0: all 60,000) --name data_parallel (the results' file name).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { availableParallelism, cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';
import type { DeviceReport } from '../launcher/summary_devices.ts';

const { values } = parseArgs({
  options: {
    backends: { type: 'string', default: 'cpu,wasm,webgpu' },
    devices: { type: 'string', default: '1,2,4' },
    models: { type: 'string', default: 'mlp,cnn' },
    'batch-size': { type: 'string', default: '128' },
    'train-size': { type: 'string', default: '4096' },
    name: { type: 'string', default: 'data_parallel' },
  },
});

function fail(message: string): never {
  console.error(`bench:data-parallel: ${message}`);
  process.exit(2);
}

const list = (v: string) =>
  v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
const backends = list(values.backends!);
for (const b of backends) if (!['cpu', 'wasm', 'webgpu', 'webgl'].includes(b)) fail(`--backends: "${b}" is not cpu, wasm, webgpu or webgl`);
const deviceCounts = list(values.devices!).map(Number);
for (const k of deviceCounts)
  if (!(Number.isSafeInteger(k) && k >= 1 && k <= 16)) fail(`--devices takes counts from 1 to 16, got "${values.devices}"`);
const models = list(values.models!);
for (const m of models) if (m !== 'mlp' && m !== 'cnn') fail(`--models: "${m}" is not mlp or cnn`);
const batchSize = Number(values['batch-size']);
if (!(Number.isSafeInteger(batchSize) && batchSize >= 1)) fail(`--batch-size must be a positive integer, got "${values['batch-size']}"`);
const trainSize = Number(values['train-size']);
if (!(Number.isSafeInteger(trainSize) && trainSize >= 0)) fail(`--train-size must be an integer >= 0, got "${values['train-size']}"`);
if (!/^[\w.-]{1,64}$/.test(values.name!)) fail('--name takes a file name of letters, digits, _ . -');

interface Row {
  model: string;
  backend: string;
  devices: number;
  ok: boolean;
  errors?: string[];
  /** Mean over the timed steps of batch / step time (the job's samplesPerSec; step 1 left out). */
  samplesPerSec: number | null;
  /** The step's mean breakdown, ms: compute (on the devices: weights out, scatter, their compute, gather), apply. */
  computeMs: number | null;
  applyMs: number | null;
  /** Each device's backend and mean compute per step (Workers only). */
  deviceBackends: string[];
  deviceComputeMs: Array<number | null>;
  fallbacks: string[];
  testAccuracy: number | null;
  seconds: number | null;
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const rows: Row[] = [];
for (const model of models) {
  for (const backend of backends) {
    if (model === 'cnn' && backend === 'wasm') continue;
    for (const devices of deviceCounts) {
      const label = `${model} on ${backend}, ${devices} device${devices === 1 ? ' (the page itself)' : 's (Workers)'}`;
      console.log(`--- ${label}: MNIST ${trainSize || 60000} samples, batch ${batchSize}, 1 epoch`);
      const started = Date.now();
      const { ok, summary } = await launch({
        nproc: 1,
        job: 'train',
        session: `bench-dp-${model}-${backend}-${devices}-${Date.now().toString(36)}`,
        timeoutSec: 3600,
        jobParams: {
          model,
          dataset: 'mnist',
          backend,
          devices: String(devices),
          'batch-size': String(batchSize),
          epochs: '1',
          'eval-every': '0',
          'test-size': '1000',
          ...(trainSize > 0 ? { 'train-size': String(trainSize) } : {}),
        },
        log: (line) => console.log(line),
      });
      const breakdown = (summary.breakdownMs ?? {}) as Record<string, number | null>;
      const reports = ((summary.deviceReports as Array<{ devices: DeviceReport[] }> | undefined)?.[0]?.devices ?? []) as DeviceReport[];
      const row: Row = {
        model,
        backend,
        devices,
        ok,
        ...(ok ? {} : { errors: (summary.errors as string[] | undefined) ?? ['failed'] }),
        samplesPerSec: num(summary.samplesPerSec),
        computeMs: num(breakdown.compute),
        applyMs: num(breakdown.apply),
        deviceBackends: reports.map((d) => d.backend),
        deviceComputeMs: reports.map((d) => d.meanComputeMs),
        fallbacks: reports.flatMap((d) => (d.fallbackReason ? [`device ${d.device}: ${d.fallbackReason}`] : [])),
        testAccuracy: num(summary.testAccuracy),
        seconds: num(summary.seconds),
      };
      rows.push(row);
      console.log(
        ok
          ? `--- done in ${Math.round((Date.now() - started) / 1000)} s: ${row.samplesPerSec} samples/s`
          : `--- FAILED: ${(row.errors ?? []).join('; ')}`,
      );
    }
  }
}

const date = new Date().toISOString().slice(0, 10);
const machine = `${availableParallelism()} cores (nproc; ${cpus()[0]?.model?.trim() ?? 'unknown CPU'}), WebGPU on SwiftShader (on the CPU), Chromium headless`;
const fig = (x: number | null, digits = 1) => (x === null ? '-' : (Math.round(x * 10 ** digits) / 10 ** digits).toString());
const base = (r: Row) => rows.find((o) => o.ok && o.model === r.model && o.backend === r.backend && o.devices === 1)?.samplesPerSec ?? null;
const lines = [
  `DataParallel inside one tab, ${date}, ${machine}.`,
  '',
  `Job: one rank, MNIST (first ${trainSize || 60000} training samples, 1000 test samples), 1 epoch, batch ${batchSize}, adam. 1 device: the page's own thread computes (no Workers); K > 1: K Workers, each a replica on its own backend, the batch split between them.`,
  '',
  '| model | backend | devices | samples/s | vs 1 device | step compute ms | device compute ms/step | device backends | test accuracy |',
  '| --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  ...rows.map((r) => {
    if (!r.ok)
      return `| ${r.model} | ${r.backend} | ${r.devices} | FAILED: ${(r.errors ?? []).join('; ').replaceAll('|', '\\|').slice(0, 200)} | | | | | |`;
    const b = base(r);
    const speedup = b && r.samplesPerSec ? `${(r.samplesPerSec / b).toFixed(2)}x` : '-';
    return `| ${r.model} | ${r.backend} | ${r.devices} | ${fig(r.samplesPerSec)} | ${speedup} | ${fig(r.computeMs)} | ${r.deviceComputeMs.length ? r.deviceComputeMs.map((m) => fig(m)).join(', ') : '-'} | ${r.deviceBackends.length ? r.deviceBackends.join(', ') : '(page)'} | ${r.testAccuracy === null ? '-' : `${(r.testAccuracy * 100).toFixed(1)}%`} |`;
  }),
  '',
  "Samples/s: the mean over the timed steps (step 1, which compiles shaders, left out) of batch / step time. Step compute: from the batch to the gradients on the host (with Workers: the weights read back and sent to each, the chunks scattered, their compute, the gathering). Device compute: each Worker's own time per step.",
];
const fallbacks = rows.flatMap((r) => r.fallbacks.map((f) => `${r.model} on ${r.backend}, ${r.devices} devices: ${f}`));
if (fallbacks.length > 0) lines.push('', 'Fallbacks:', ...fallbacks.map((f) => `- ${f}`));

const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(join(dir, `${values.name}.json`), JSON.stringify({ date, machine, batchSize, trainSize, rows }, null, 1));
await writeFile(join(dir, `${values.name}.md`), `${lines.join('\n')}\n`);
console.log(lines.join('\n'));
process.exitCode = rows.every((r) => r.ok) ? 0 : 1;
