/**
 * `npm run bench:rpc-ps-accuracy`: the parameter-server port (examples/09: 1 server + 2 trainers,
 * torch's tutorial, RPC + distributed autograd + DistributedOptimizer) on MNIST, beside the same
 * model trained in one tab on the same batches (bench/rpc_ps_accuracy_script.ts): the test
 * accuracy of each on MNIST's test split. Writes bench/results/rpc_ps_accuracy.json and .md.
 *
 * Options: --steps S (150, each trainer's), --eval N (10000 test images), --backend (cpu).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    steps: { type: 'string', default: '150' },
    eval: { type: 'string', default: '10000' },
    backend: { type: 'string', default: 'cpu' },
  },
});
for (const key of ['steps', 'eval'] as const)
  if (!/^[1-9]\d*$/.test(values[key]!)) {
    console.error(`bench:rpc-ps-accuracy: --${key} must be a positive integer, got "${values[key]}"`);
    process.exit(2);
  }
const args = ['--steps', values.steps!, '--eval', values.eval!, '--batch-size', '32'];

async function run(nproc: number, job: string, extra: string[]) {
  const t0 = Date.now();
  const { ok, summary, results } = await launch({
    nproc,
    job: join(PROJECT_ROOT, job),
    scriptArgs: [...args, ...extra],
    session: `bench-rpc-ps-${nproc}-${Date.now().toString(36)}`,
    timeoutSec: 600,
    jobParams: { backend: values.backend! },
  });
  if (!ok) {
    console.error(`bench:rpc-ps-accuracy: ${job} failed: ${JSON.stringify(summary).slice(0, 2000)}`);
    process.exit(1);
  }
  return {
    summary: summary as Record<string, unknown>,
    results: results as Array<Record<string, unknown>>,
    seconds: (Date.now() - t0) / 1000,
  };
}

const rpc = await run(3, 'examples/09_rpc_parameter_server.ts', ['--dataset', 'mnist']);
// Each rank's own result (the launcher's page order is not the RPC ranks').
const trainers = rpc.results
  .filter((r) => r.role === 'trainer')
  .map((r) => ({ rank: Number(r.rank), finalLoss: Number(r.finalLoss), accuracy: Number(r.accuracy) }))
  .sort((a, b) => a.rank - b.rank);
if (trainers.length !== 2) {
  console.error(`bench:rpc-ps-accuracy: expected 2 trainers' figures, got ${JSON.stringify(rpc.summary).slice(0, 500)}`);
  process.exit(1);
}
const single = await run(1, 'bench/rpc_ps_accuracy_script.ts', ['--trainers', '2']);
const one = single.summary as { finalLoss: number; accuracy: number; updates: number };

const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Debian Chromium, ${values.backend} backend`;
const date = new Date().toISOString().slice(0, 10);
const pct = (a: number) => `${(100 * a).toFixed(2)}%`;
const md = [
  `# The parameter-server port (examples/09) against one tab, MNIST (${date})`,
  '',
  `Machine: ${machine}. Command: \`npm run bench:rpc-ps-accuracy -- --steps ${values.steps} --eval ${values.eval}\`.`,
  `Both train the mlp (seed 0) with SGD lr 0.05 on the same ${Number(values.steps) * 2} batches of 32 MNIST training images`,
  `(each trainer ${values.steps}); the accuracy is on the first ${values.eval} images of MNIST's test split.`,
  '',
  '| run | updates | final loss | test accuracy | seconds |',
  '| --- | ---: | ---: | ---: | ---: |',
  ...trainers.map(
    (t) =>
      `| RPC parameter server, trainer ${t.rank} (3 tabs) | ${Number(values.steps) * 2} | ${t.finalLoss.toFixed(4)} | ${pct(t.accuracy)} | ${rpc.seconds.toFixed(0)} |`,
  ),
  `| one tab, the same batches in turn | ${one.updates} | ${one.finalLoss.toFixed(4)} | ${pct(one.accuracy)} | ${single.seconds.toFixed(0)} |`,
  '',
  "The trainers step the server's one model in turn as their calls arrive (asynchronously, as torch's tutorial does);",
  "each trainer measures the server's model when its own loop ends, so the two differ by what the other trained since.",
  '',
].join('\n');
console.log(md);
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(
  join(dir, 'rpc_ps_accuracy.json'),
  JSON.stringify(
    { date, machine, options: values, rpc: { trainers, seconds: rpc.seconds }, single: { ...one, seconds: single.seconds } },
    null,
    2,
  ),
);
await writeFile(join(dir, 'rpc_ps_accuracy.md'), md);
process.exit(0);
