/**
 * `npm run bench:robust`: robust aggregation against hostile ranks. The train job's MNIST MLP in a
 * group of --nproc tabs, where the last K ranks (--attackers, 0 = a clean run) play an attack on
 * their own gradient before it is reduced (--attacks: scale, flip, noise, alie; the job's attack
 * option, src/parallel/robust/attacks.ts), with the plain mean and with each robust aggregator
 * (--aggregations). Records the final test accuracy, samples/s, bytes each rank sent per step and
 * whether the replicas ended identical. Writes bench/results/NAME.json and NAME.md after every
 * run (a long matrix keeps what finished) and prints the table. A failed run is recorded and the
 * others go on.
 *
 * Options: --nproc 8, --attacks scale,flip,noise,alie, --attackers 1,2 (0, the clean runs, always
 * come first), --aggregations mean,trimmed-mean:2 (the job's aggregation values), --backend cpu,
 * --batch-size 32 (per rank), --train-size 16384, --test-size 2000, --epochs 1, --timeout 900
 * (seconds per run), --name robust, --merge a.json (rows of an earlier part).
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    nproc: { type: 'string', default: '8' },
    attacks: { type: 'string', default: 'scale,flip,noise,alie' },
    attackers: { type: 'string', default: '1,2' },
    aggregations: { type: 'string', default: 'mean,trimmed-mean:2' },
    backend: { type: 'string', default: 'cpu' },
    'batch-size': { type: 'string', default: '32' },
    'train-size': { type: 'string', default: '16384' },
    'test-size': { type: 'string', default: '2000' },
    epochs: { type: 'string', default: '1' },
    timeout: { type: 'string', default: '900' },
    name: { type: 'string', default: 'robust' },
    merge: { type: 'string' },
    'skip-clean': { type: 'boolean', default: false },
  },
});

const list = (s: string) =>
  s
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean);
const int = (name: string, s: string, least = 0): number => {
  const n = Number(s);
  if (!Number.isSafeInteger(n) || n < least) throw new Error(`--${name} must be an integer >= ${least}, got "${s}"`);
  return n;
};
const nproc = int('nproc', values.nproc!, 2);
const attacks = list(values.attacks!);
const attackerCounts = list(values.attackers!).map((s) => int('attackers', s, 1));
if (attackerCounts.some((k) => k >= nproc)) throw new Error(`--attackers must leave at least one honest rank of the ${nproc}`);
const aggregations = list(values.aggregations!);
if (!/^[\w.-]{1,64}$/.test(values.name!))
  throw new Error(`--name must be a file name of letters, digits, _ . - (at most 64), got "${values.name}"`);

interface Row {
  aggregation: string;
  attack: string;
  attackers: number;
  ok: boolean;
  errors?: string[];
  steps: number | null;
  seconds: number | null;
  testAccuracy: number | null;
  finalLoss: number | null;
  samplesPerSec: number | null;
  bytesPerStep: number | null;
  identical: boolean | null;
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);

async function runOnce(aggregation: string, attack: string, attackers: number): Promise<Row> {
  const started = Date.now();
  const { ok, summary } = await launch({
    nproc,
    job: 'train',
    session: `bench-robust-${aggregation.replace(/[^A-Za-z0-9]/g, '')}-${attack}-${attackers}-${started.toString(36)}`,
    timeoutSec: int('timeout', values.timeout!, 1),
    jobParams: {
      model: 'mlp',
      dataset: 'mnist',
      backend: values.backend!,
      optimizer: 'adam',
      epochs: values.epochs!,
      'batch-size': values['batch-size']!,
      'train-size': values['train-size']!,
      'test-size': values['test-size']!,
      'eval-every': '0',
      aggregation,
      ...(attackers > 0 ? { attack, attackers: String(attackers) } : {}),
    },
    log: (line) => {
      if (/^\[rank 0\] .*(step \d+0\/|test accuracy)|error|fail/i.test(line)) console.log(line);
    },
  });
  const s = summary as Record<string, unknown>;
  const comm = (s.comm ?? {}) as Record<string, unknown>;
  return {
    aggregation,
    attack: attackers > 0 ? attack : 'none',
    attackers,
    ok,
    ...(Array.isArray(s.errors) && s.errors.length > 0 ? { errors: (s.errors as unknown[]).map(String) } : {}),
    steps: num(s.steps),
    seconds: num(s.seconds) ?? (Date.now() - started) / 1000,
    testAccuracy: num(s.testAccuracy),
    finalLoss: num(s.finalLoss),
    samplesPerSec: num(s.samplesPerSec),
    bytesPerStep: num(s.bytesPerStep) ?? num(comm.bytesPerStep),
    identical: typeof s.identical === 'boolean' ? s.identical : null,
  };
}

const pct = (x: number | null) => (x === null ? '-' : `${(x * 100).toFixed(1)}%`);

function table(rows: Row[]): string {
  const clean = new Map(rows.filter((r) => r.attackers === 0 && r.ok).map((r) => [r.aggregation, r.testAccuracy]));
  const lines = [
    '| aggregation | attack | attackers | test accuracy | vs clean (same aggregation) | samples/s | bytes/step/rank | identical | steps | s |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  ];
  for (const r of rows) {
    const base = clean.get(r.aggregation) ?? null;
    const delta = r.testAccuracy !== null && base !== null && base !== undefined ? `${((r.testAccuracy - base) * 100).toFixed(1)} pt` : '-';
    lines.push(
      `| ${r.aggregation} | ${r.attack} | ${r.attackers} | ${r.ok ? pct(r.testAccuracy) : `failed: ${(r.errors ?? ['?'])[0]!.slice(0, 80)}`} | ${delta} | ${r.samplesPerSec ?? '-'} | ${r.bytesPerStep ?? '-'} | ${r.identical ?? '-'} | ${r.steps ?? '-'} | ${r.seconds === null ? '-' : Math.round(r.seconds)} |`,
    );
  }
  return lines.join('\n');
}

const rows: Row[] = [];
for (const file of values.merge ? list(values.merge) : []) {
  const earlier = JSON.parse(await readFile(resolve(file), 'utf8')) as { rows?: Row[] };
  if (!Array.isArray(earlier.rows)) throw new Error(`--merge ${file}: no rows in it (a ${values.name}.json of this bench?)`);
  rows.push(...earlier.rows);
}
const outDir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(outDir, { recursive: true });
const machine = `${cpus().length} cores (${cpus()[0]?.model.trim() ?? 'unknown CPU'}), headless Chromium, WebRTC over loopback`;

async function save(): Promise<void> {
  const when = new Date().toISOString().slice(0, 10);
  const head = `# Robust aggregation against hostile ranks\n\n${when}, ${machine}. \`npm run bench:robust -- --nproc ${nproc} --attacks ${attacks.join(',')} --attackers ${attackerCounts.join(',')} --aggregations ${aggregations.join(',')} --backend ${values.backend} --batch-size ${values['batch-size']} --train-size ${values['train-size']} --test-size ${values['test-size']}\`: the train job's MNIST MLP (784-128-10, Adam), ${nproc} tabs, the last K ranks attacking their own gradient (src/parallel/robust/attacks.ts).\n\n`;
  await writeFile(join(outDir, `${values.name}.json`), `${JSON.stringify({ date: when, machine, nproc, rows }, null, 2)}\n`);
  await writeFile(join(outDir, `${values.name}.md`), `${head + table(rows)}\n`);
}

const plan: Array<[string, string, number]> = [];
for (const aggregation of aggregations) {
  if (!values['skip-clean']) plan.push([aggregation, 'none', 0]);
  for (const k of attackerCounts) for (const attack of attacks) plan.push([aggregation, attack, k]);
}
for (const [aggregation, attack, k] of plan) {
  console.log(`[bench] ${aggregation}, ${k > 0 ? `${k} x ${attack}` : 'no attacker'}`);
  let row: Row;
  try {
    row = await runOnce(aggregation, attack, k);
  } catch (err) {
    row = {
      aggregation,
      attack,
      attackers: k,
      ok: false,
      errors: [(err as Error).message],
      steps: null,
      seconds: null,
      testAccuracy: null,
      finalLoss: null,
      samplesPerSec: null,
      bytesPerStep: null,
      identical: null,
    };
  }
  rows.push(row);
  console.log(
    `[bench] -> ${row.ok ? `accuracy ${pct(row.testAccuracy)}, ${row.samplesPerSec} samples/s, identical ${row.identical}` : `failed: ${row.errors?.[0]}`}`,
  );
  await save();
}
console.log(table(rows));
process.exitCode = rows.every((r) => r.ok) ? 0 : 1;
