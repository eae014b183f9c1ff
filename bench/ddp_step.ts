/**
 * `npm run bench:ddp-step`: one rank's DDP step against a plain TF.js training loop of the same
 * model and batch (a 784-128-10 MLP at batch 64 by default, Adam), per backend, on this machine.
 * The page (bench/ddp_step_script.ts, run by the launcher as torchrun runs a script) times three
 * ways alternately: the plain loop (optimizer.minimize), DDP with the host Adam (the gradients
 * read back, the update on the host, the weights uploaded: what keeps mixed backends identical),
 * and DDP with TF.js's Adam on the device. Prints and writes bench/results/ddp_step.json and .md.
 *
 * Options: --backends webgpu,webgl,cpu --batch-size 64 --hidden 128 --steps 60 --rounds 3
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    backends: { type: 'string', default: 'webgpu,webgl,cpu' },
    'batch-size': { type: 'string', default: '64' },
    hidden: { type: 'string', default: '128' },
    steps: { type: 'string', default: '60' },
    rounds: { type: 'string', default: '3' },
  },
});
const backends = values
  .backends!.split(',')
  .map((s) => s.trim())
  .filter(Boolean);
for (const b of backends) {
  if (!['webgpu', 'webgl', 'wasm', 'cpu'].includes(b)) {
    console.error(`bench:ddp-step: --backends: "${b}" is not webgpu, webgl, wasm or cpu`);
    process.exit(2);
  }
}
for (const k of ['batch-size', 'hidden', 'steps', 'rounds'] as const) {
  if (!/^[1-9]\d{0,5}$/.test(values[k]!)) {
    console.error(`bench:ddp-step: --${k} takes a positive integer, got "${values[k]}"`);
    process.exit(2);
  }
}

interface Row {
  backend: string;
  ok: boolean;
  error?: string;
  parameters?: number;
  medianMs?: Record<string, number>;
  hostOverPlain?: number;
  deviceOverPlain?: number;
}

const rows: Row[] = [];
for (const backend of backends) {
  const { ok, summary } = await launch({
    nproc: 1,
    job: join(PROJECT_ROOT, 'bench', 'ddp_step_script.ts'),
    scriptArgs: ['--batch-size', values['batch-size']!, '--hidden', values.hidden!, '--steps', values.steps!, '--rounds', values.rounds!],
    session: `bench-ddp-step-${backend}-${Date.now().toString(36)}`,
    timeoutSec: 600,
    jobParams: { backend },
  });
  const s = summary as Record<string, unknown>;
  if (!ok || s.backend !== backend) {
    rows.push({
      backend,
      ok: false,
      error: ok ? `the page ran on ${String(s.backend)}` : String((s.errors as string[] | undefined)?.[0] ?? 'failed'),
    });
    continue;
  }
  rows.push({
    backend,
    ok: true,
    parameters: s.parameters as number,
    medianMs: s.medianMs as Record<string, number>,
    hostOverPlain: s.hostOverPlain as number,
    deviceOverPlain: s.deviceOverPlain as number,
  });
}

const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Debian Chromium, WebGPU and WebGL through SwiftShader (no GPU)`;
const date = new Date().toISOString().slice(0, 10);
const lines = [
  `# One rank's DDP step against a plain TF.js loop (${date})`,
  '',
  `Machine: ${machine}. Command: \`npm run bench:ddp-step -- --backends ${backends.join(',')} --batch-size ${values['batch-size']} --hidden ${values.hidden}\`.`,
  `Model: MLP 784-${values.hidden}-10, batch ${values['batch-size']}, Adam; median step over ${Number(values.steps) * Number(values.rounds)} timed steps per way, the ways alternating in ${values.rounds} rounds.`,
  '',
  '| backend | parameters | plain loop (ms) | DDP, host Adam (ms) | DDP, device Adam (ms) | host / plain | device / plain |',
  '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
  ...rows.map((r) =>
    r.ok
      ? `| ${r.backend} | ${r.parameters} | ${r.medianMs!.plain!.toFixed(2)} | ${r.medianMs!['ddp-host']!.toFixed(2)} | ${r.medianMs!['ddp-device']!.toFixed(2)} | ${r.hostOverPlain!.toFixed(2)}x | ${r.deviceOverPlain!.toFixed(2)}x |`
      : `| ${r.backend} | failed: ${r.error} | | | | | |`,
  ),
  '',
];
const md = lines.join('\n');
console.log(md);
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(join(dir, 'ddp_step.json'), JSON.stringify({ date, machine, options: values, rows }, null, 2));
await writeFile(join(dir, 'ddp_step.md'), md);
process.exit(rows.every((r) => r.ok) ? 0 : 1);
