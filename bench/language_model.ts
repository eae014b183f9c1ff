/**
 * `npm run bench:language-model`: the character-level transformer (examples/08_language_model.ts)
 * trained with DDP through the launcher, for each world size of --nprocs: its loss against the
 * tokens seen, the unigram baseline of the corpus (the first 20 chapters of Moby-Dick), tokens/s
 * and what it writes at the end. Writes bench/results/language_model.{json,md} after each run.
 * Options: --nprocs 1,2 (default 2), --steps 300, --backend cpu|webgpu (default cpu), and the
 * example's --batch-size 16, --context 64, --width 64, --blocks 2.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    nprocs: { type: 'string', default: '2' },
    steps: { type: 'string', default: '300' },
    backend: { type: 'string', default: 'cpu' },
    'batch-size': { type: 'string', default: '16' },
    context: { type: 'string', default: '64' },
    width: { type: 'string', default: '64' },
    blocks: { type: 'string', default: '2' },
  },
});

interface Row {
  nproc: number;
  ok: boolean;
  parameters: number | null;
  unigram: number | null;
  finalLoss: number | null;
  tokensPerSec: number | null;
  curve: Array<{ step: number; tokens: number; loss: number }>;
  sample: string | null;
  wallSeconds: number;
  errors: unknown;
}

const rows: Row[] = [];
const args = [
  '--steps',
  values.steps!,
  '--batch-size',
  values['batch-size']!,
  '--context',
  values.context!,
  '--width',
  values.width!,
  '--blocks',
  values.blocks!,
  '--log-every',
  String(Math.max(1, Math.round(Number(values.steps) / 10))),
];
const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : null);

async function write(): Promise<void> {
  const dir = join(PROJECT_ROOT, 'bench', 'results');
  await mkdir(dir, { recursive: true });
  const date = new Date().toISOString().slice(0, 10);
  const machine = `${cpus().length} cores (${cpus()[0]?.model.trim() ?? '?'}), Chromium headless, backend ${values.backend}`;
  await writeFile(join(dir, 'language_model.json'), JSON.stringify({ date, machine, args, rows }, null, 2));
  const md = [
    `Character-level transformer (examples/08_language_model.ts ${args.join(' ')}), DDP, ${date}, ${machine}. Corpus: datasets/moby-dick-1-20.txt (201,646 characters, vocabulary 76). Loss: rank 0's batch loss at that step, nats per character; the unigram baseline is the entropy of the characters' frequencies.`,
    '',
    '| ranks | parameters | unigram | final loss | perplexity | tokens/s | wall s |',
    '| --- | --- | --- | --- | --- | --- | --- |',
    ...rows.map(
      (r) =>
        `| ${r.nproc} | ${r.parameters ?? '–'} | ${r.unigram?.toFixed(3) ?? '–'} | ${r.finalLoss?.toFixed(3) ?? (r.ok ? '–' : 'FAILED')} | ${r.finalLoss === null ? '–' : Math.exp(r.finalLoss).toFixed(2)} | ${r.tokensPerSec === null ? '–' : Math.round(r.tokensPerSec)} | ${Math.round(r.wallSeconds)} |`,
    ),
    '',
    ...rows.flatMap((r) => [
      `Loss against tokens, ${r.nproc} rank(s): ${r.curve.map((c) => `${c.tokens}: ${c.loss.toFixed(3)}`).join(', ')}.`,
      '',
      `What it wrote: ${JSON.stringify(r.sample)}`,
      '',
    ]),
  ].join('\n');
  await writeFile(join(dir, 'language_model.md'), md);
}

for (const nproc of values.nprocs!.split(',').map(Number)) {
  const t0 = Date.now();
  const { ok, summary } = await launch({
    nproc,
    job: join(PROJECT_ROOT, 'examples', '08_language_model.ts'),
    scriptArgs: args,
    session: `lm-${nproc}-${Date.now().toString(36)}`,
    timeoutSec: 2400,
    jobParams: { backend: values.backend! },
    log: (line) => {
      if (line.includes('step ') || line.startsWith('[launch]')) console.log(line);
    },
  });
  rows.push({
    nproc,
    ok,
    parameters: num(summary.parameters),
    unigram: num(summary.unigram),
    finalLoss: num(summary.finalLoss),
    tokensPerSec: num(summary.tokensPerSec),
    curve: Array.isArray(summary.curve) ? (summary.curve as Row['curve']) : [],
    sample: typeof summary.sample === 'string' ? summary.sample : null,
    wallSeconds: (Date.now() - t0) / 1000,
    errors: summary.errors ?? null,
  });
  await write();
  console.log(`${nproc} rank(s): loss ${rows.at(-1)!.finalLoss} (unigram ${rows.at(-1)!.unigram}), ${rows.at(-1)!.tokensPerSec} tokens/s`);
}
