/**
 * The examples, run exactly as the README shows them: `npm run launch -- ... examples/X.ts ...`
 * in a child process, which builds the script into a page, opens the ranks and prints the
 * summary as its last line. The elastic one is the acceptance run: a rank killed at
 * step 8, the rest finish. All on TF.js's cpu backend: the scripts' subject is the group, not the
 * device, and SwiftShader compiles shaders for seconds on every page. A cpu step takes tens of ms,
 * so the faults' runs take smaller batches (more steps of the same samples): a kill or a join,
 * which reaches a page a second or more after its step, then still lands mid-run.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildScript } from '../../launcher/build_script.ts';
import { PROJECT_ROOT } from '../../signaling/server.ts';
import { expect, launchCommand, test } from './fixtures.ts';

test('03_elastic_train.ts: 4 ranks, rank 2 killed at step 8; the rest finish with the same weights, each sample once', async () => {
  // 2048 samples of 32 a step (4 x 8): 8 steps on 4 ranks, then about 75 on 3.
  const r = await launchCommand([
    '--nproc',
    '4',
    '--min',
    '2',
    '--max',
    '4',
    '--kill',
    '2@8',
    '--backend',
    'cpu',
    'examples/03_elastic_train.ts',
    '--dataset',
    'synthetic',
    '--train-size',
    '2048',
    '--batch-size',
    '8',
    '--epochs',
    '1',
  ]);
  expect(r.code, r.output).toBe(0);
  const s = r.summary as {
    generations: number;
    stepsRedone: number;
    weightHashes: string[];
    samplesSeen: Array<{ samples: number; exactlyOnce: boolean; complete: boolean }>;
    finalLoss: number;
    faults: Array<{ detectedAfterMs: number }>;
  };
  console.log(JSON.stringify(s));
  expect(s.generations).toBeGreaterThanOrEqual(2);
  expect(s.stepsRedone).toBeLessThanOrEqual(1);
  expect(s.weightHashes).toHaveLength(3);
  expect(new Set(s.weightHashes).size).toBe(1);
  expect(s.samplesSeen[0]).toEqual({ samples: 2048, exactlyOnce: true, complete: true });
  expect(s.finalLoss).toBeLessThan(1.2); // 4 classes: ln 4 = 1.39 at the start
  expect(s.faults[0]!.detectedAfterMs).toBeLessThan(10_000);
});

test('03_elastic_train.ts --powersgd 2: a rank joins while PowerSGD is in force and takes the hook state; all three end with the same weights', async () => {
  // 2 ranks, steps of 8 samples; compression from step 11; a third tab opens at step 14 and is in
  // a round within about 250 steps (it loads beside two training pages). The first round forms as
  // soon as both tabs are in (--last-call 500: no third is coming then).
  const r = await launchCommand([
    '--nproc',
    '2',
    '--min',
    '2',
    '--max',
    '3',
    '--join',
    '1@14',
    '--last-call',
    '500',
    '--backend',
    'cpu',
    'examples/03_elastic_train.ts',
    '--dataset',
    'synthetic',
    '--train-size',
    '2048',
    '--batch-size',
    '4',
    '--epochs',
    '1',
    '--powersgd',
    '2',
  ]);
  expect(r.code, r.output).toBe(0);
  const s = r.summary as {
    generations: number;
    weightHashes: string[];
    samplesSeen: Array<{ samples: number; exactlyOnce: boolean }>;
    finalLoss: number;
  };
  expect(s.generations).toBeGreaterThanOrEqual(2);
  expect(s.weightHashes).toHaveLength(3);
  expect(new Set(s.weightHashes).size).toBe(1);
  expect(s.samplesSeen[0]).toMatchObject({ samples: 2048, exactlyOnce: true });
  expect(s.finalLoss).toBeLessThan(1.2);
});

test('03_elastic_train.ts --diloco 8 --stream 2: streaming DiLoCo through a kill; the survivors end with the same weights, each sample once', async () => {
  // 3 ranks, 2048 samples of 24 a step, then 16: about 120 steps; fragments at steps 4 and 8 of every 8; rank 1 killed at step 6.
  const r = await launchCommand([
    '--nproc',
    '3',
    '--min',
    '2',
    '--max',
    '3',
    '--kill',
    '1@6',
    '--backend',
    'cpu',
    'examples/03_elastic_train.ts',
    '--dataset',
    'synthetic',
    '--train-size',
    '2048',
    '--batch-size',
    '8',
    '--epochs',
    '1',
    '--diloco',
    '8',
    '--stream',
    '2',
  ]);
  expect(r.code, r.output).toBe(0);
  const s = r.summary as {
    generations: number;
    weightHashes: string[];
    samplesSeen: Array<{ samples: number; exactlyOnce: boolean; complete: boolean }>;
    finalLoss: number;
    bytesPerStep: number;
  };
  expect(s.generations).toBeGreaterThanOrEqual(2);
  expect(s.weightHashes).toHaveLength(2);
  expect(new Set(s.weightHashes).size).toBe(1);
  expect(s.samplesSeen[0]).toEqual({ samples: 2048, exactlyOnce: true, complete: true });
  expect(s.finalLoss).toBeLessThan(1.2);
  // Inner steps send nothing through DDP.
  expect(s.bytesPerStep).toBe(0);
});

test('02_ddp_train.ts: plain DDP on 2 ranks trains and reports its loss and weights', async () => {
  const r = await launchCommand([
    '--nproc',
    '2',
    '--backend',
    'cpu',
    'examples/02_ddp_train.ts',
    '--dataset',
    'synthetic',
    '--epochs',
    '2',
  ]);
  expect(r.code, r.output).toBe(0);
  expect(r.summary).toMatchObject({ script: 'examples/02_ddp_train.ts', worldSize: 2, ok: true });
  expect(r.summary.finalLoss as number).toBeLessThan(1.2);
  expect(r.summary.weightHash).toMatch(/^[0-9a-f]{8}$/);
  expect(r.output).toContain('[rank 1] epoch 1: loss');
});

test('04_dataparallel_train.ts: 2 ranks of 2 cpu devices each train with DDP and end with the same weights', async () => {
  const r = await launchCommand([
    '--nproc',
    '2',
    '--backend',
    'cpu',
    'examples/04_dataparallel_train.ts',
    '--devices',
    '2',
    '--dataset',
    'synthetic',
  ]);
  expect(r.code, r.output).toBe(0);
  expect(r.summary).toMatchObject({ script: 'examples/04_dataparallel_train.ts', worldSize: 2, ok: true });
  expect(r.summary.finalLoss as number).toBeLessThan(1.2);
  const devices = r.summary.devices as Array<{ backend: string; samples: number; liveTensors: { min: number; max: number } }>;
  // Rank 0's 1024 samples of the epoch, half on each device; no tensor left behind in either.
  expect(devices.map((d) => [d.backend, d.samples])).toEqual([
    ['cpu', 512],
    ['cpu', 512],
  ]);
  for (const d of devices) expect(d.liveTensors.min).toBe(d.liveTensors.max);
  // verifyReplicas: the ranks compared their weights and agreed (it throws on every rank otherwise).
  expect(r.summary.weightHash).toMatch(/^[0-9a-f]{8}$/);
  expect(r.output).toContain('[rank 1] devices: 0 on cpu, 1 on cpu');
});

test('01_collectives.ts: every collective checks out on 3 ranks', async () => {
  const r = await launchCommand(['--nproc', '3', '--backend', 'cpu', 'examples/01_collectives.ts']);
  expect(r.code, r.output).toBe(0);
  expect(r.summary).toMatchObject({ script: 'examples/01_collectives.ts', worldSize: 3, checks: 5, ok: true });
  expect(r.output).toContain('[rank 2] allGather: [0,10,20]');
});

test('05_pipeline_train.ts: 2 stages x 2 replicas train; each stage reports its layers and both bubbles', async () => {
  const { code, summary, output } = await launchCommand([
    '--nproc',
    '4',
    '--backend',
    'cpu',
    'examples/05_pipeline_train.ts',
    '--stages',
    '2',
    '--micro-batches',
    '4',
    '--dataset',
    'synthetic',
    '--batch-size',
    '32',
    '--steps',
    '12',
  ]);
  if (code !== 0) console.log(output.split('\n').slice(-30).join('\n'));
  expect(code).toBe(0);
  // Rank 0's result: stage 0 holds the first Dense layer (16 x 32 + 32 parameters).
  expect(summary).toMatchObject({ stage: 0, parameters: 544 });
  expect((summary.bubble as { formula: number }).formula).toBeCloseTo(1 / 5);
  expect(Number.isFinite(summary.finalLoss)).toBe(true);
  expect(output).toMatch(/stage 1 of 2 \(replica 1\): layers 1 Dense, 132 parameters/);
});

test('06_ps_train.ts: 1 server and 2 workers train asynchronously; every sample is accounted for', async () => {
  const { code, summary, output } = await launchCommand([
    '--nproc',
    '3',
    '--backend',
    'cpu',
    'examples/06_ps_train.ts',
    '--ps',
    '1',
    '--dataset',
    'synthetic',
    '--batch-size',
    '32',
    '--steps',
    '24',
  ]);
  if (code !== 0) console.log(output.split('\n').slice(-30).join('\n'));
  expect(code).toBe(0);
  // Rank 0's result: the server, which applied every push (24 steps of 32 samples, by the workers together).
  expect(summary).toMatchObject({ role: 'server', index: 0, versions: [24] });
  expect(summary.samples).toMatchObject({ target: 24 * 32, leased: 24 * 32, lost: 0 });
  expect(output).toMatch(/worker \d+ \(\d+ pushes\); samples applied 768/);
});

test("a project outside the clone depends on the package, and its script runs under the package's launcher (npx browser-ddp launch)", async () => {
  const dir = await mkdtemp(join(tmpdir(), 'my-training-'));
  try {
    // A project of its own, depending on the clone by path, as the README says; offline: nothing is downloaded.
    await writeFile(
      join(dir, 'package.json'),
      JSON.stringify({ name: 'my-training', private: true, type: 'module', dependencies: { 'browser-ddp': `file:${PROJECT_ROOT}` } }),
    );
    const installed = await run('npm', ['install', '--offline', '--no-audit', '--no-fund'], dir);
    expect(installed.code, installed.output).toBe(0);
    const source = await readFile('examples/01_collectives.ts', 'utf8');
    await writeFile(join(dir, 'my_collectives.ts'), source.replaceAll("'../src/index.ts'", "'browser-ddp'"));
    expect(await readFile(join(dir, 'my_collectives.ts'), 'utf8')).toContain("from 'browser-ddp'");
    // A wrong command says what the package's command does: asked while the right one runs.
    const wrongRun = run('npx', ['--offline', 'browser-ddp', 'train'], dir);
    const r = await run('npx', ['--offline', 'browser-ddp', 'launch', '--nproc', '2', 'my_collectives.ts'], dir);
    expect(r.code, r.output).toBe(0);
    const summary = JSON.parse(
      r.output
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .at(-1) ?? '{}',
    ) as Record<string, unknown>;
    expect(summary).toMatchObject({ script: 'my_collectives.ts', worldSize: 2, checks: 5, ok: true });
    const wrong = await wrongRun;
    expect(wrong.code).toBe(2);
    expect(wrong.output).toMatch(/usage: browser-ddp launch/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

function run(command: string, args: string[], cwd: string): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, output }));
  });
}

/** The ```ts block after `marker` in docs/library.md (the library's documentation), as it is. */
async function docsScript(marker: string): Promise<string> {
  const doc = await readFile('docs/library.md', 'utf8');
  const at = doc.indexOf(marker);
  expect(at, `docs/library.md still has "${marker}"`).toBeGreaterThan(0);
  return /```ts\n([\s\S]*?)```/.exec(doc.slice(at))![1]!;
}

for (const { marker, args } of [
  { marker: "Without the elastic runner, torch's shape, as a whole script", args: ['--nproc', '2', '--backend', 'cpu'] },
  {
    marker: 'A training script for the launcher (`examples/03_elastic_train.ts`, shortened',
    // --last-call 1000: the launcher's server would wait 5 s for the two tabs nobody opens (up to --max 4).
    args: ['--nproc', '2', '--min', '1', '--max', '4', '--last-call', '1000', '--backend', 'cpu'],
  },
]) {
  test(`docs/library.md's script "${marker.slice(0, 40)}…" runs as written, from a folder outside the clone`, async () => {
    const dir = await mkdtemp(join(tmpdir(), 'readme-script-'));
    try {
      const script = join(dir, 'my_train.ts');
      await writeFile(script, await docsScript(marker));
      const r = await launchCommand([...args, script]);
      expect(r.code, r.output).toBe(0);
      expect(r.summary).toMatchObject({ worldSize: 2, ok: true });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
}

test('a rank that destroys its group straight after its last all-reduce, without a barrier, does not fail the peer still receiving its last message', async () => {
  // Rank 0's ring all-reduce is done once it has received; what it sent last can still be queued
  // on its link (4 MiB buffers: more than the send queue's high-water mark). destroy() hands it to
  // the network before it closes the links and its connection to the server.
  const dir = await mkdtemp(join(tmpdir(), 'destroy-script-'));
  try {
    const script = join(dir, 'destroy_early.ts');
    await writeFile(
      script,
      `import { initProcessGroup, type LaunchContext } from 'browser-ddp';
export default async function main(ctx: LaunchContext) {
  const pg = await initProcessGroup({ url: ctx.url, session: ctx.session, token: ctx.token, worldSize: ctx.nproc });
  const buf = new Float32Array(1 << 20);
  for (let i = 0; i < 3; i++) {
    buf.fill(pg.rank + 1);
    await pg.allReduce(buf, 'sum');
    if (buf[0] !== 3 || buf[buf.length - 1] !== 3) throw new Error('rank ' + pg.rank + ': wrong sum ' + buf[0]);
  }
  await pg.destroy();
  return { sum: buf[0] };
}
`,
    );
    // Two runs, side by side (the page built once first): each its own server and Chromium.
    await buildScript(script, () => {});
    const runs = await Promise.all([0, 1].map(() => launchCommand(['--nproc', '2', '--backend', 'cpu', script])));
    for (const r of runs) {
      expect(r.code, r.output.slice(-3000)).toBe(0);
      expect(r.summary).toMatchObject({ worldSize: 2, ok: true });
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('a script that does not exist, or a script argument before the path, is refused with what to do', async () => {
  const [missing, misplaced] = await Promise.all([
    launchCommand(['--nproc', '2', 'examples/no_such_script.ts']),
    launchCommand(['--nproc', '2', '--epochs', '2', 'examples/02_ddp_train.ts']),
  ]);
  expect(missing.code).toBe(1);
  expect(missing.output).toMatch(/no script at .*no_such_script\.ts/);
  expect(misplaced.code).toBe(2);
  expect(misplaced.output).toContain("unknown launcher option --epochs: a script's own arguments go after its path");
});

test('08_language_model.ts: 2 ranks train the character transformer on Moby-Dick; same weights, the loss falls, it writes', async () => {
  const r = await launchCommand([
    '--nproc',
    '2',
    '--backend',
    'cpu',
    'examples/08_language_model.ts',
    '--steps',
    '10',
    '--batch-size',
    '8',
    '--context',
    '32',
    '--width',
    '32',
    '--blocks',
    '1',
    '--log-every',
    '5',
    '--lr',
    '0.01',
  ]);
  expect(r.code, r.output.slice(-3000)).toBe(0);
  const s = r.summary as {
    finalLoss: number;
    unigram: number;
    vocabSize: number;
    weightHash: string;
    sample: string;
    curve: Array<{ tokens: number; loss: number }>;
  };
  console.log(JSON.stringify({ ...s, curve: s.curve }));
  expect(s.vocabSize).toBe(76);
  // ln 76 = 4.33 at the start; the unigram baseline is about 3.05, reached in about 10 steps at
  // this rate (3.47 after 5 steps, 3.01 to 3.05 after 10, in runs on 2 cores).
  expect(s.finalLoss).toBeLessThan(Math.log(s.vocabSize) - 0.8);
  expect(s.curve[1]!.loss).toBeLessThan(s.curve[0]!.loss);
  expect(s.sample.startsWith('Call me ')).toBe(true);
  expect(s.sample.length).toBe('Call me '.length + 80);
  expect(s.curve.map((c) => c.tokens)).toEqual([5 * 8 * 32 * 2, 10 * 8 * 32 * 2]);
});
