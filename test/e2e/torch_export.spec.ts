/**
 * The trained model in PyTorch, the way a user gets it there: 2 real tabs train the MNIST CNN with
 * DDP (examples/07_torch_export.ts) and save a checkpoint on the server's disk; `npm run
 * export:torch` turns that file into model.safetensors + model.py; real PyTorch loads them
 * (strict load_state_dict) and gives the tab's logits for the same test images.
 */
import { execFileSync } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { launch } from '../../launcher/run.ts';
import { PROJECT_ROOT } from '../../signaling/server.ts';
import { encodeSafetensors } from '../../src/checkpoint/safetensors.ts';
import { torchTestsBlocked } from '../fixtures/torch.ts';
import { expect, sessionName, test } from './fixtures.ts';

// Skipped only on a developer's machine without python3-torch; CI installs it and sets
// DDP_REQUIRE_ALL_TESTS, under which torchTestsBlocked throws instead of skipping.
const blocked = torchTestsBlocked();

test("2 tabs train the CNN; its checkpoint, exported, gives the tab's logits in PyTorch (max abs difference <= 1e-4)", async () => {
  test.skip(blocked !== undefined, blocked);
  const dir = await mkdtemp(join(tmpdir(), 'torch-e2e-'));
  try {
    const session = sessionName('torch');
    const lines: string[] = [];
    const { ok, summary } = await launch({
      nproc: 2,
      job: join(PROJECT_ROOT, 'examples', '07_torch_export.ts'),
      scriptArgs: ['--model', 'cnn', '--steps', '8', '--batch-size', '16'],
      session,
      timeoutSec: 240,
      // The export is the subject, not the device (the tab's logits are checked whatever computed
      // them): on WebGPU, SwiftShader's convolution shaders made this run 26 s longer on a busy
      // 2-core machine (3 steps took as long as 8: it is the compiling).
      jobParams: { backend: 'cpu' },
      serverOptions: { checkpointDir: join(dir, 'ckpt') },
      log: (l) => lines.push(l),
    });
    if (!ok) console.log(lines.slice(-30).join('\n'));
    expect(ok).toBe(true);
    const result = summary as { checkpoint: string; inputs: number[]; inputShape: number[]; logits: number[]; finalLoss: number };
    expect(result.finalLoss).toBeLessThan(2.3); // ln 10 at the start

    const files = await readdir(join(dir, 'ckpt', session));
    expect(files).toContain(`${result.checkpoint}.ckpt`);
    const out = join(dir, 'torch');
    const cli = execFileSync(
      'npm',
      ['run', '--silent', 'export:torch', '--', join(dir, 'ckpt', session, `${result.checkpoint}.ckpt`), '--out', out],
      { cwd: PROJECT_ROOT, encoding: 'utf8', timeout: 60_000 },
    );
    expect(cli).toContain('conv1.weight');
    expect(cli).toMatch(/input: float32 \[N, 1, 28, 28\]/);

    const n = result.inputs.length / 784;
    await writeFile(
      join(out, 'inputs.safetensors'),
      encodeSafetensors([
        { name: 'x', dtype: 'F32', shape: [n, ...result.inputShape], data: new Uint8Array(new Float32Array(result.inputs).buffer) },
      ]),
    );
    execFileSync('/usr/bin/python3', [join(PROJECT_ROOT, 'test', 'fixtures', 'torch_forward.py'), out], {
      stdio: 'pipe',
      timeout: 120_000,
    });
    const torchOut = JSON.parse(await readFile(join(out, 'outputs.json'), 'utf8')) as { shape: number[]; values: number[] };
    expect(torchOut.shape).toEqual([n, 10]);
    const diff = Math.max(...torchOut.values.map((v, i) => Math.abs(v - result.logits[i]!)));
    console.log(`torch vs the tab: max abs difference ${diff.toExponential(2)} over ${torchOut.values.length} logits`);
    expect(diff).toBeLessThanOrEqual(1e-4);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
