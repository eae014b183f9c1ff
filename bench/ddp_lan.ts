/**
 * `npm run bench:ddp-lan` (root): DDP training where the link is the bound. MNIST MLP and CNN,
 * 4 ranks, on loopback and on the launcher's LAN in a box at 100 and 20 Mbit/s (--lan): step time,
 * its breakdown (compute, readback, all-reduce not hidden, apply), the communication share and
 * samples/s. Writes bench/results/ddp_lan.json and ddp_lan.md and prints the table.
 *
 * Options: --nproc (4), --steps (20), --models mlp,cnn, --rates 0,100,20 (0 = loopback),
 * --batch-size (64 per rank).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    nproc: { type: 'string', default: '4' },
    steps: { type: 'string', default: '20' },
    models: { type: 'string', default: 'mlp,cnn' },
    rates: { type: 'string', default: '0,100,20' },
    'batch-size': { type: 'string', default: '64' },
  },
});

interface Breakdown {
  compute: number;
  readback: number;
  allreduce: number;
  apply: number;
}

interface Row {
  model: string;
  rateMbit: number | null;
  steps: number;
  samplesPerSec: number;
  stepMs: number;
  breakdownMs: Breakdown;
  commShare: number;
  testAccuracy: number | null;
  identical: boolean;
}

const nproc = Number(values.nproc);
const rows: Row[] = [];
for (const model of values.models!.split(',')) {
  for (const rate of values.rates!.split(',').map(Number)) {
    const where = rate > 0 ? `--lan ${rate}` : 'loopback';
    console.log(`--- ${model}, ${nproc} ranks, ${where}`);
    const { ok, summary } = await launch({
      nproc,
      job: 'train',
      session: `bench-ddp-${model}-${rate}-${Date.now().toString(36)}`,
      timeoutSec: 1800,
      jobParams: { model, dataset: 'mnist', steps: values.steps!, 'batch-size': values['batch-size']!, 'eval-every': '100000' },
      ...(rate > 0 ? { lan: { rateMbit: rate } } : {}),
      log: (line) => console.log(line),
    });
    if (!ok) {
      console.error(JSON.stringify(summary));
      process.exit(1);
    }
    const s = summary as unknown as {
      steps: number;
      samplesPerSec: number;
      breakdownMs: Breakdown;
      testAccuracy?: number;
      identical: boolean;
    };
    const b = s.breakdownMs;
    const stepMs = b.compute + b.readback + b.allreduce + b.apply;
    rows.push({
      model,
      rateMbit: rate > 0 ? rate : null,
      steps: s.steps,
      samplesPerSec: s.samplesPerSec,
      stepMs: Math.round(stepMs * 10) / 10,
      breakdownMs: b,
      commShare: Math.round((b.allreduce / stepMs) * 100) / 100,
      testAccuracy: s.testAccuracy ?? null,
      identical: s.identical,
    });
  }
}

const date = new Date().toISOString().slice(0, 10);
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Chromium headless, WebGPU on SwiftShader; --lan: each rank its own Chromium in its own network namespace, links shaped with tbf`;
const lines = [
  `DDP training, ${nproc} ranks, MNIST, batch ${values['batch-size']} per rank, ${values.steps} steps, ${date}, ${machine}. Per step, averaged over steps and ranks.`,
  '',
  '| model | network | step ms | compute ms | readback ms | all-reduce ms (not hidden) | apply ms | communication share | samples/s | identical |',
  '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  ...rows.map(
    (r) =>
      `| ${r.model} | ${r.rateMbit === null ? 'loopback' : `${r.rateMbit} Mbit/s`} | ${r.stepMs} | ${r.breakdownMs.compute} | ${r.breakdownMs.readback} | ${r.breakdownMs.allreduce} | ${r.breakdownMs.apply} | ${Math.round(r.commShare * 100)}% | ${r.samplesPerSec} | ${r.identical ? 'yes' : 'NO'} |`,
  ),
  '',
  'All-reduce ms is the part of the step spent waiting for gradients to be averaged after they were read back (the rest overlaps the readback). Communication share: that wait over the step.',
];
const table = lines.join('\n');
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(join(dir, 'ddp_lan.json'), `${JSON.stringify({ date, machine, nproc, steps: Number(values.steps), rows }, null, 2)}\n`);
await writeFile(join(dir, 'ddp_lan.md'), `${table}\n`);
console.log(`\n${table}`);
