/**
 * torch's four RPC tutorials, ported (examples/09-12), run as the README shows them: the launcher
 * opens 3 ranks in Chromium, each trains, and every worker ends its graceful shutdown owning
 * nothing: every RRef was released. The parameter server runs on WebGPU (its owners read the
 * device back in DistributedOptimizer's step); the others on the cpu backend (their subject is the
 * RPC framework over real WebRTC links, not the device). The numbers of steps are small. Last,
 * RPC between two browsers: a Chromium rank (cpu) and a Firefox ESR rank (WebGL: no WebGPU).
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { launch } from '../../launcher/run.ts';
import { expect, launchCommand, sessionName, test } from './fixtures.ts';

interface Trainer {
  rank: number;
  finalLoss: number;
  accuracy: number;
  fcHash?: string;
}

async function run(example: string, steps: number, backend = 'cpu') {
  const r = await launchCommand(['--nproc', '3', '--backend', backend, `examples/${example}`, '--steps', String(steps)]);
  expect(r.code, r.output).toBe(0);
  const s = r.summary as { ownedAfterShutdown: number; trainers?: Trainer[]; accuracy?: number; finalLoss?: number };
  console.log(JSON.stringify(s));
  expect(s.ownedAfterShutdown, 'rank 0 owns nothing after the graceful shutdown').toBe(0);
  return s;
}

test('09: the parameter-server tutorial: 2 trainers train the server model through RPC, distributed autograd and DistributedOptimizer', async () => {
  // On WebGPU: the owners read their parameters and gradients back from the device (DistributedOptimizer's step).
  const s = await run('09_rpc_parameter_server.ts', 20, 'webgpu');
  expect(s.trainers!.map((t) => t.rank)).toEqual([1, 2]);
  for (const t of s.trainers!) expect(t.accuracy).toBeGreaterThan(0.9); // 4 classes: 0.25 by chance
});

test('10: the pipeline tutorial: the master drives micro-batches through 2 shards on 2 tabs and trains both', async () => {
  const s = await run('10_rpc_pipeline.ts', 20);
  expect(s.accuracy).toBeGreaterThan(0.9);
  expect(s.finalLoss).toBeLessThan(1.0); // ln 4 = 1.39 at the start
});

test('11: the DDP + RPC tutorial: a remote embedding table and a dense layer under DDP on 2 trainers, identical on both', async () => {
  const s = await run('11_rpc_ddp.ts', 30);
  const [a, b] = s.trainers!;
  expect(a!.fcHash).toBe(b!.fcHash);
  for (const t of s.trainers!) expect(t.accuracy).toBeGreaterThan(0.8);
});

test('12: the batch-update tutorial: asynchronous executions answer both trainers once per batch; both learn', async () => {
  const s = await run('12_rpc_batch_server.ts', 20);
  for (const t of s.trainers!) expect(t.accuracy).toBeGreaterThan(0.85);
});

test('a callee whose tab closes mid-call fails the caller at once, naming the worker, the function and the lost rank', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'rpc-close-'));
  try {
    const script = join(dir, 'callee_closes.ts');
    // Rank 1 takes the call, then leaves as a closing tab does (its pagehide); rank 0 reports how its call ended.
    await writeFile(
      script,
      `import { initProcessGroup, initRpc, rpc, type LaunchContext } from 'browser-ddp';
export default async function main(ctx: LaunchContext) {
  const pg = await initProcessGroup({ url: ctx.url, session: ctx.session, token: ctx.token, worldSize: 2 });
  let called = () => {};
  const started = new Promise<void>((r) => (called = r));
  const hang = () => {
    called();
    return new Promise(() => {});
  };
  const agent = await initRpc({ group: pg, name: (r) => 'w' + r, functions: { hang } });
  if (agent.rank === 1) {
    await started;
    pg.leave();
    return { left: true };
  }
  const t0 = performance.now();
  try {
    await rpc.rpcSync('w1', 'hang', [], { timeoutMs: 30000 });
    return { error: null };
  } catch (e) {
    const err = e as Error & { worker?: string; fn?: string; cause?: Error };
    return { error: err.name, worker: err.worker, fn: err.fn, cause: err.cause?.name, message: err.message, ms: performance.now() - t0 };
  }
}
`,
    );
    const r = await launchCommand(['--nproc', '2', '--backend', 'cpu', script]);
    expect(r.code, r.output.slice(-3000)).toBe(0);
    const s = r.summary as { error: string; worker: string; fn: string; cause: string; message: string; ms: number };
    expect(s).toMatchObject({ error: 'RpcUnreachableError', worker: 'w1', fn: 'hang', cause: 'PeerLostError' });
    expect(s.message).toContain('lost rank 1');
    expect(s.ms).toBeLessThan(10_000); // not the call's 30 s timeout
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

/** The cross-browser script: each rank calls the other (tensors, an RRef, one distributed backward). */
const CROSS_BROWSER = `import * as tf from '@tensorflow/tfjs';
import { distAutograd, initRpc, rpc, type LaunchContext } from 'browser-ddp';
export default async function main(ctx: LaunchContext) {
  // The rank without WebGPU (Firefox on Linux) computes on WebGL.
  if (!('gpu' in navigator)) await tf.setBackend('webgl');
  const w = tf.variable(tf.tensor2d([[0.5, -1], [2, 0.25], [-0.75, 1.5]]), true, 'w');
  const agent = await initRpc({
    url: ctx.url, session: ctx.session, token: ctx.token, worldSize: 2, name: (r) => 'w' + r, rpcTimeoutMs: 15000,
    functions: {
      info: () => ({ userAgent: navigator.userAgent, backend: tf.getBackend() }),
      scale: (t: tf.Tensor, k: number) => t.mul(k),
      inc: (t: tf.Tensor) => t.add(tf.scalar(1, 'int32')),
      box: (n: number) => ({ n, list: [1, 'two', null] }),
      layer: (x: tf.Tensor) => tf.tidy(() => x.matMul(w)),
    },
  });
  const other = agent.rank === 0 ? 'w1' : 'w0';
  const peer = await rpc.rpcSync(other, 'info');
  const y = await rpc.rpcSync<tf.Tensor>(other, 'scale', [tf.tensor2d([1, 2, 3, 4], [2, 2]), 3]);
  const i = await rpc.rpcSync<tf.Tensor>(other, 'inc', [tf.tensor1d([1, -2], 'int32')]);
  const ref = rpc.remote(other, 'box', [7]);
  const box = await ref.toHere();
  ref.release();
  // x through the other browser's layer: its gradient here, against this tab's own of the same layer.
  const x = tf.variable(tf.tensor2d([[1, 2, 3], [-1, 0.5, 2]]), true, 'x');
  const target = tf.tensor2d([[1, 0], [0, 1]]);
  const lossOf = (out: tf.Tensor) => tf.sum(tf.square(out.sub(target))) as tf.Scalar;
  let remote: number[] = [];
  await distAutograd.context(async (id) => {
    const out = await rpc.rpcSync<tf.Tensor>(other, 'layer', [x]);
    await distAutograd.backward(id, () => lossOf(out));
    remote = Array.from(await distAutograd.getGradients(id).get(x)!.data());
  });
  const local = tf.variableGrads(() => lossOf(x.matMul(w)), [x]);
  const result = {
    rank: agent.rank, backend: tf.getBackend(), peer,
    scaled: { shape: y.shape, dtype: y.dtype, values: Array.from(await y.data()) },
    ints: { dtype: i.dtype, values: Array.from(await i.data()) },
    box, remote, local: Array.from(await local.grads['x']!.data()),
  };
  await rpc.shutdown();
  return { ...result, ownedAfterShutdown: agent.ownedRRefs().length };
}
`;

test('RPC between a Chromium rank (cpu) and a Firefox ESR rank (WebGL, no WebGPU): tensors, an RRef and a distributed backward, both ways', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'rpc-firefox-'));
  try {
    const script = join(dir, 'cross_browser.ts');
    await writeFile(script, CROSS_BROWSER);
    const { ok, summary, results } = await launch({
      nproc: 2,
      job: script,
      session: sessionName('rpc-firefox'),
      timeoutSec: 60,
      browsers: { ranks: ['chromium', 'firefox'], join: 'chromium' },
      jobParams: { backend: 'cpu' },
    });
    expect(ok, JSON.stringify(summary)).toBe(true);
    type Side = Record<string, unknown> & { backend: string; peer: { userAgent: string; backend: string } };
    const byRank = [0, 1].map((r) => results.find((x) => x.rank === r) as unknown as Side);
    expect(byRank.map((r) => [r.backend, r.peer.backend])).toEqual([
      ['cpu', 'webgl'],
      ['webgl', 'cpu'],
    ]);
    expect(byRank[0]!.peer.userAgent).toContain('Firefox/');
    expect(byRank[1]!.peer.userAgent).toContain('Chrome/');
    for (const r of byRank) {
      expect(r.scaled).toEqual({ shape: [2, 2], dtype: 'float32', values: [3, 6, 9, 12] });
      expect(r.ints).toEqual({ dtype: 'int32', values: [2, -1] });
      expect(r.box).toEqual({ n: 7, list: [1, 'two', null] });
      // Computed on the other browser's backend: equal to this tab's own within float rounding.
      const [got, want] = [r.remote as number[], r.local as number[]];
      expect(got).toHaveLength(6);
      for (let k = 0; k < 6; k++) expect(Math.abs(got[k]! - want[k]!)).toBeLessThanOrEqual(1e-4 * Math.max(1, Math.abs(want[k]!)));
      expect(r.ownedAfterShutdown).toBe(0);
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
