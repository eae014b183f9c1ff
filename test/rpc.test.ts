/**
 * torch.distributed.rpc here (src/rpc/): calls by registered name, RRefs with the owner's
 * reference counting, and every way a call fails, between agents on a real server's process
 * group with in-memory peer links (the WebRTC links run the same frames in test/e2e).
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { PeerLostError } from '../src/wire/errors.ts';
import { RpcAgent, type RpcFunction } from '../src/rpc/agent.ts';
import { initRpc, rpcSync, remote, shutdown, getWorkerInfo } from '../src/rpc/api.ts';
import { RpcRemoteError, RpcSerializationError, RpcTimeoutError, RpcUnreachableError } from '../src/rpc/errors.ts';
import type { RRef } from '../src/rpc/rref.ts';
import { DistributedOptimizer } from '../src/rpc/distributed_optimizer.ts';
import { RemoteModule } from '../src/rpc/remote_module.ts';
import { SGD } from '../src/nn/optim.ts';
import { withServer } from './fixtures/server.ts';
import { memoryGroups } from './fixtures/memory_groups.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';

/** The error `p` rejects with; fails the test if it resolves. */
async function rejection(p: Promise<unknown>): Promise<Error & Record<string, unknown>> {
  try {
    await p;
  } catch (err) {
    return err as Error & Record<string, unknown>;
  }
  throw new Error('expected a rejection, the promise resolved');
}

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number): Promise<ProcessGroup[]> {
  return (await memoryGroups(server.url, n, 'rpc')).pgs;
}

/** n agents named worker0.., each with `functions` (made per rank), started together. */
async function agents(n: number, functions: (rank: number) => Record<string, RpcFunction> = () => ({}), rpcTimeoutMs = 5_000) {
  const pgs = await groups(n);
  const all = pgs.map((pg, rank) => {
    const a = new RpcAgent(pg.openMessageChannel(), n, { name: `worker${rank}`, rpcTimeoutMs });
    for (const [name, fn] of Object.entries(functions(rank))) a.register(name, fn);
    return a;
  });
  await Promise.all(all.map((a) => a.start(5_000)));
  return { all, pgs };
}

async function close(set: { all: RpcAgent[]; pgs: ProcessGroup[] }) {
  await Promise.all(set.all.map((a) => a.shutdown({ graceful: false })));
  await Promise.all(set.pgs.map((pg) => pg.destroy()));
}

class Counter {
  constructor(public count: number) {}
  add(n: number): number {
    this.count += n;
    return this.count;
  }
  snapshot(): { count: number } {
    return { count: this.count };
  }
}

describe('rpc: calls by name', () => {
  it('carries JSON values, tensors (dtype and shape kept), typed arrays and undefined both ways, to another worker and to itself', async () => {
    const set = await agents(3, (rank) => ({
      echo: (...args: unknown[]) => ({ rank, args }),
      scale: (t: tf.Tensor, k: number) => t.mul(k),
    }));
    const [a] = set.all;
    const x = tf.tensor2d([1, 2, 3, 4, 5, 6], [2, 3]);
    const mask = tf.tensor1d([true, false], 'bool');
    const ints = tf.tensor1d([7, -8], 'int32');
    const got = (await a!.rpcAsync('worker1', 'echo', [
      { n: 1.5, s: 'x', nan: Number.NaN, inf: -Infinity, u: undefined, $t: 'not a tensor' },
      new Float32Array([0.5, 2]),
      mask,
      ints,
    ])) as { rank: number; args: unknown[] };
    expect(got.rank).toBe(1);
    expect(got.args[0]).toEqual({ n: 1.5, s: 'x', nan: Number.NaN, inf: -Infinity, u: undefined, $t: 'not a tensor' });
    expect(got.args[1]).toEqual(new Float32Array([0.5, 2]));
    const [m, i] = got.args.slice(2) as tf.Tensor[];
    expect([m!.dtype, m!.shape, await m!.data()]).toEqual(['bool', [2], new Uint8Array([1, 0])]);
    expect([i!.dtype, await i!.data()]).toEqual(['int32', new Int32Array([7, -8])]);
    const y = (await a!.rpcAsync<tf.Tensor>(2, 'scale', [x, 2])) as tf.Tensor;
    expect(y.shape).toEqual([2, 3]);
    expect(Array.from(await y.data())).toEqual([2, 4, 6, 8, 10, 12]);
    // To itself, through the same encoding: a copy.
    const self = (await a!.rpcAsync('worker0', 'echo', [x])) as { rank: number; args: tf.Tensor[] };
    expect(self.rank).toBe(0);
    expect(self.args[0]).not.toBe(x);
    tf.dispose([x, mask, ints, y, m!, i!, self.args[0]!]);
    await close(set);
  });

  it('the callee disposes the tensors of its arguments and result once it replied; tf.keep and variables stay', async () => {
    let kept: tf.Tensor | undefined;
    const v = tf.variable(tf.ones([2]));
    const set = await agents(2, () => ({
      sum: (t: tf.Tensor) => t.sum(),
      keep: (t: tf.Tensor) => {
        kept = tf.keep(t);
        return null;
      },
      weights: () => v,
    }));
    const x = tf.ones([4]);
    const before = tf.memory().numTensors;
    for (let i = 0; i < 5; i++) tf.dispose(await set.all[0]!.rpcAsync<tf.Tensor>(1, 'sum', [x]));
    await set.all[0]!.rpcAsync(1, 'keep', [x]);
    tf.dispose(await set.all[0]!.rpcAsync<tf.Tensor>(1, 'weights'));
    // One tensor more: the kept argument (both agents share this process's engine).
    expect(tf.memory().numTensors).toBe(before + 1);
    expect(kept!.isDisposed).toBe(false);
    expect(v.isDisposed).toBe(false);
    tf.dispose([x, kept!, v]);
    await close(set);
  });

  it('an unknown function, a throwing one and a value that cannot cross each fail with a named error', async () => {
    const set = await agents(2, () => ({
      boom: () => {
        throw new TypeError('bad input');
      },
      fn: () => () => 1,
    }));
    const a = set.all[0]!;
    const unknown = await rejection(a.rpcAsync('worker1', 'nope'));
    expect(unknown).toBeInstanceOf(RpcRemoteError);
    expect(unknown).toMatchObject({ worker: 'worker1', fn: 'nope', remoteType: 'RangeError' });
    expect((unknown as Error).message).toContain('no function "nope" is registered on worker worker1 (registered: boom, fn)');
    const thrown = await rejection(a.rpcAsync('worker1', 'boom'));
    expect(thrown).toMatchObject({ worker: 'worker1', fn: 'boom', remoteType: 'TypeError', remoteMessage: 'bad input' });
    // A result that cannot cross: the callee says so.
    expect(await rejection(a.rpcAsync('worker1', 'fn'))).toMatchObject({ remoteType: 'RpcSerializationError' });
    // An argument that cannot cross: refused here, naming where it is.
    const arg = await rejection(a.rpcAsync('worker1', 'boom', [{ f: () => 1 }]));
    expect(arg).toBeInstanceOf(RpcUnreachableError);
    expect((arg as Error).cause).toBeInstanceOf(RpcSerializationError);
    expect((arg as Error).message).toContain('args[0].f: a function cannot be sent');
    expect(() => a.rpcAsync('worker9', 'boom')).toThrow('no RPC worker is named "worker9" (workers: worker0, worker1)');
    await close(set);
  });

  it('times out a call with no reply, naming the worker, the function and the bound', async () => {
    const set = await agents(2, () => ({ never: () => new Promise(() => {}) }), 300);
    const err = await rejection(set.all[0]!.rpcAsync('worker1', 'never'));
    expect(err).toBeInstanceOf(RpcTimeoutError);
    expect(err).toMatchObject({ worker: 'worker1', fn: 'never', timeoutMs: 300 });
    await close(set);
  });

  it('a callee that stops answering (its page paused, not closed) times out, naming it and the bound; the caller goes on calling the others', async () => {
    const { pgs, net } = await memoryGroups(server.url, 3, 'rpc-frozen');
    const all = pgs.map((pg, rank) => new RpcAgent(pg.openMessageChannel(), 3, { name: `worker${rank}`, rpcTimeoutMs: 300 }));
    for (const a of all) a.register('echo', (x: unknown) => x);
    await Promise.all(all.map((a) => a.start(5_000)));
    const [caller] = all;
    const rref = caller!.remote<number[]>('worker1', 'echo', [[1, 2]]);
    expect(await rref.toHere()).toEqual([1, 2]);
    // Worker 1 freezes: it reads nothing more, and nothing of it arrives (its links stay open).
    for (const peer of [0, 2]) {
      net.end(1, peer)!.stall();
      net.end(peer, 1)!.stall();
    }
    const frozen = await Promise.all([rejection(caller!.rpcAsync('worker1', 'echo', [1])), rejection(rref.toHere())]);
    for (const [err, fn] of [
      [frozen[0], 'echo'],
      [frozen[1], 'toHere'],
    ] as const) {
      expect(err).toBeInstanceOf(RpcTimeoutError);
      expect(err).toMatchObject({ worker: 'worker1', fn, timeoutMs: 300 });
      expect(err.message).toBe(`rpc to worker1 calling "${fn}" timed out after 300 ms with no reply`);
    }
    // The others still answer, well past the bound, and a new call to the frozen one times out on its own.
    for (let i = 0; i < 3; i++) expect(await caller!.rpcAsync('worker2', 'echo', [i])).toBe(i);
    expect(await all[2]!.rpcAsync('worker0', 'echo', ['back'])).toBe('back');
    expect(await rejection(caller!.rpcAsync('worker1', 'echo', [2], 200))).toMatchObject({ worker: 'worker1', timeoutMs: 200 });
    rref.release();
    await Promise.all(all.map((a) => a.shutdown({ graceful: false })));
    // Not awaited: the stalled links never drain, and destroy closes them after its 2 s grace.
    for (const pg of pgs) void pg.destroy();
  });

  it('a callee whose group closes mid-call fails the caller at once, naming the worker, the function and the lost rank; its RRefs say their owner is gone', async () => {
    const set = await agents(2, () => ({ never: () => new Promise(() => {}), box: () => ({ x: 1 }) }), 30_000);
    const rref = set.all[0]!.remote('worker1', 'box');
    await rref.toHere();
    const call = rejection(set.all[0]!.rpcAsync('worker1', 'never'));
    const started = Date.now();
    set.pgs[1]!.leave();
    const err = await call;
    expect(err).toBeInstanceOf(RpcUnreachableError);
    expect(err).toMatchObject({ worker: 'worker1', fn: 'never' });
    expect((err as Error).cause).toBeInstanceOf(PeerLostError);
    expect((err as Error).message).toContain('lost rank 1');
    expect(Date.now() - started).toBeLessThan(5_000);
    // An RRef whose owner is gone says so.
    const gone = await rejection(rref.toHere());
    expect(gone).toBeInstanceOf(RpcUnreachableError);
    expect(gone).toMatchObject({ worker: 'worker1', fn: 'toHere' });
    await close(set);
  });

  it('a function that returns a promise does not hold its worker: batched calls complete together (async execution)', async () => {
    let batch: Array<() => void> = [];
    const set = await agents(
      3,
      (rank): Record<string, RpcFunction> =>
        rank === 0
          ? {
              // Answers once 2 callers wait, as torch's batch-update tutorial does.
              update: () =>
                new Promise<number>((resolve) => {
                  batch.push(() => resolve(2));
                  if (batch.length === 2) for (const go of batch.splice(0)) go();
                }),
            }
          : {},
    );
    const results = await Promise.all([set.all[1]!.rpcAsync(0, 'update'), set.all[2]!.rpcAsync(0, 'update')]);
    expect(results).toEqual([2, 2]);
    batch = [];
    await close(set);
  });
});

describe('rpc: RRefs', () => {
  it('remote() keeps the value on its owner: toHere, localValue on the owner, methods called there', async () => {
    const set = await agents(2, () => ({ counter: (n: number) => new Counter(n), fail: () => Promise.reject(new Error('no value')) }));
    const [a, b] = set.all;
    const rref = a!.remote<Counter>('worker1', 'counter', [5]);
    expect(rref.ownerName()).toBe('worker1');
    expect(rref.isOwner()).toBe(false);
    expect(await rref.rpcSync().add(3)).toBe(8);
    expect(await rref.rpcAsync().snapshot()).toEqual({ count: 8 });
    // A class instance cannot cross (JavaScript cannot pickle it): toHere says so.
    expect(await rejection(rref.toHere())).toMatchObject({ remoteType: 'RpcSerializationError' });
    expect(() => rref.localValue()).toThrow('localValue() is for the owner (worker1); this is worker0: use toHere()');
    // The owner's own reference reads the value itself.
    const own = b!.remote<Counter>('worker1', 'counter', [1]);
    expect(await own.toHere()).toBeInstanceOf(Counter);
    expect(own.localValue()).toBeInstanceOf(Counter);
    expect(await rejection(rref.rpcSync().constructor())).toMatchObject({ remoteType: 'TypeError' });
    const failed = a!.remote('worker1', 'fail');
    expect(await rejection(failed.toHere())).toMatchObject({ worker: 'worker1', fn: 'toHere', remoteMessage: 'no value' });
    await close(set);
  });

  it('the owner keeps the value while any reference lives, forks from user to user included, and deletes it with the last', async () => {
    const held: RRef[] = [];
    const set = await agents(3, (rank) => ({
      make: () => tf.ones([3]),
      // Worker 2 keeps what it is given (a fork of worker 0's reference).
      hold: (r: RRef) => {
        if (rank === 2) held.push(r);
        return r.ownerName();
      },
    }));
    const [a, owner] = set.all;
    const rref = a!.remote<tf.Tensor>('worker1', 'make');
    await rref.toHere().then((t) => t.dispose());
    expect(owner!.ownedRRefs()).toEqual([{ id: rref.id, forks: 1, state: 'ready' }]);
    expect(await a!.rpcAsync('worker2', 'hold', [rref])).toBe('worker1');
    expect(owner!.ownedRRefs()[0]!.forks).toBe(2);
    rref.release();
    await waitFor('the owner to drop worker 0 fork', () => owner!.ownedRRefs()[0]?.forks === 1);
    // Worker 2's fork alone keeps it.
    const copy = (await held[0]!.toHere()) as tf.Tensor;
    expect(Array.from(await copy.data())).toEqual([1, 1, 1]);
    copy.dispose();
    const tensors = tf.memory().numTensors;
    held[0]!.release();
    await waitFor('the owner to delete the value', () => owner!.ownedRRefs().length === 0);
    expect(tf.memory().numTensors).toBe(tensors - 1);
    expect(() => rref.toHere()).toThrow('which this worker released');
    await close(set);
  });

  it('a graceful shutdown waits for outstanding calls and releases every reference, so owners end with nothing', async () => {
    let finish: (() => void) | undefined;
    const set = await agents(3, () => ({
      slow: () => new Promise<string>((r) => (finish = () => r('done'))),
      counter: () => new Counter(0),
    }));
    const [a, b] = set.all;
    const refs = [
      a!.remote<Counter>('worker1', 'counter'),
      a!.remote<Counter>('worker2', 'counter'),
      b!.remote<Counter>('worker0', 'counter'),
    ];
    await Promise.all(refs.map((r) => r.rpcSync().snapshot()));
    const call = a!.rpcAsync('worker1', 'slow');
    const down = Promise.all(set.all.map((x) => x.shutdown()));
    await waitFor('the slow call to start', () => finish !== undefined);
    finish!();
    expect(await call).toBe('done');
    await down;
    for (const x of set.all) expect(x.ownedRRefs()).toEqual([]);
    expect(await rejection(a!.rpcAsync('worker1', 'slow'))).toBeInstanceOf(RpcUnreachableError);
    await Promise.all(set.pgs.map((pg) => pg.destroy()));
  });

  it('refuses a message over maxMessageBytes before sending it', async () => {
    const pgs = await groups(2);
    const all = pgs.map((pg, r) => new RpcAgent(pg.openMessageChannel(1 << 16), 2, { name: `w${r}` }));
    all[1]!.register('len', (a: Float32Array) => a.length);
    await Promise.all(all.map((x) => x.start(5_000)));
    expect(await all[0]!.rpcAsync('w1', 'len', [new Float32Array(1000)])).toBe(1000);
    const err = await rejection(all[0]!.rpcAsync('w1', 'len', [new Float32Array(1 << 15)]));
    expect((err as Error).message).toContain('over the 65536-byte bound (maxMessageBytes)');
    await close({ all, pgs });
  });
});

describe('rpc: initRpc and the module functions', () => {
  it('initRpc joins a group, registers the functions, and the module functions act through it until shutdown', async () => {
    const session = uniqueSession('rpc-init');
    const agent = await initRpc({
      name: 'solo',
      url: server.url,
      session,
      token: tokenFor(session),
      worldSize: 1,
      functions: { add: (x: number, y: number) => x + y, box: (x: number) => ({ x }) },
    });
    expect(getWorkerInfo()).toEqual({ name: 'solo', id: 0 });
    expect(await rpcSync('solo', 'add', [2, 3])).toBe(5);
    const r = remote<{ x: number }>(0, 'box', [4]);
    expect(await r.toHere()).toEqual({ x: 4 });
    await expect(initRpc({ name: 'again', group: undefined })).rejects.toThrow('RPC is already initialized on this page (as solo)');
    await shutdown();
    expect(agent.ownedRRefs()).toEqual([]);
    expect(() => rpcSync('solo', 'add', [1, 1])).toThrow('RPC is not initialized on this page');
  });
});

describe('rpc: distributed autograd', () => {
  it("the gradients across workers equal one tab's (rel. error <= 1e-6), with a worker reached twice and a parameter used on two workers", async () => {
    const rand = (shape: number[], seed: number) => tf.randomNormal(shape, 0, 1, 'float32', seed);
    const W1 = tf.variable(rand([4, 3], 1), true, 'rpc_test_W1');
    const W2 = tf.variable(rand([3, 2], 2), true, 'rpc_test_W2');
    const W0 = tf.variable(rand([2, 1], 3), true, 'rpc_test_W0');
    const [x1, x2, y] = [rand([5, 4], 4), rand([5, 4], 5), rand([5, 1], 6)];
    const a = (x: tf.Tensor) => tf.relu(x.matMul(W1));
    const b = (h: tf.Tensor) => h.matMul(W2);
    const lossOf = (o1: tf.Tensor, o2: tf.Tensor, w1: tf.Tensor) =>
      tf.sum(tf.square(o1.add(o2).matMul(W0).sub(y))).add(tf.sum(tf.square(w1))) as tf.Scalar;
    // One tab: the same model, every parameter local.
    const single = tf.variableGrads(() => lossOf(b(a(x1!)), b(a(x2!)), W1), [W1, W2, W0]);
    const set = await agents(3, (rank): Record<string, RpcFunction> => (rank === 1 ? { a, w1: () => W1 } : rank === 2 ? { b } : {}));
    const [driver, one, two] = set.all;
    const w1ref = driver!.remote<tf.Variable>(1, 'w1');
    let loss = 0;
    let grads: Array<tf.Tensor | undefined> = [];
    await driver!.autograd.context(async (ctx) => {
      // Worker 1 twice; worker 2 on each of its outputs; W1 itself fetched and used here too.
      const h1 = await driver!.rpcAsync<tf.Tensor>(1, 'a', [x1]);
      const h2 = await driver!.rpcAsync<tf.Tensor>(1, 'a', [x2]);
      const o1 = await driver!.rpcAsync<tf.Tensor>(2, 'b', [h1]);
      const o2 = await driver!.rpcAsync<tf.Tensor>(2, 'b', [h2]);
      const w1 = await w1ref.toHere();
      loss = await driver!.autograd.backward(ctx, () => lossOf(o1, o2, w1));
      grads = [
        one!.autograd.getGradients(ctx).get(W1),
        two!.autograd.getGradients(ctx).get(W2),
        driver!.autograd.getGradients(ctx).get(W0),
      ];
      grads = grads.map((g) => g?.clone());
    });
    expect(loss).toBeCloseTo((await tf.tidy(() => lossOf(b(a(x1!)), b(a(x2!)), W1)).data())[0]!, 4);
    const names = ['rpc_test_W1', 'rpc_test_W2', 'rpc_test_W0'];
    for (const [i, name] of names.entries()) {
      const want = await single.grads[name]!.data();
      const got = await grads[i]!.data();
      let diff = 0;
      let norm = 0;
      for (let k = 0; k < want.length; k++) {
        diff += (got[k]! - want[k]!) ** 2;
        norm += want[k]! ** 2;
      }
      expect(Math.sqrt(diff / norm), name).toBeLessThanOrEqual(1e-6);
    }
    // The context is gone everywhere once it ended.
    await waitFor('worker 1 to drop the context', () => {
      try {
        one!.autograd.getGradients('0.1');
        return false;
      } catch {
        return true;
      }
    });
    w1ref.release();
    tf.dispose([...grads.filter((g) => g !== undefined), ...Object.values(single.grads), single.value, x1!, x2!, y!, W1, W2, W0]);
    await close(set);
  });
});

describe('rpc: an RRef handed into a differentiated forward (the pipeline tutorial)', () => {
  it("fetched with toHere() inside each shard's forward, the gradients come back through both hops to the master's input, as one tab's (rel. error <= 1e-6)", async () => {
    const rand = (shape: number[], seed: number) => tf.randomNormal(shape, 0, 1, 'float32', seed);
    const W1 = tf.variable(rand([4, 3], 11), true, 'rpc_pipe_W1');
    const W2 = tf.variable(rand([3, 2], 12), true, 'rpc_pipe_W2');
    const X = tf.variable(rand([5, 4], 13), true, 'rpc_pipe_X');
    const y = rand([5, 2], 14);
    const shard1 = (x: tf.Tensor) => tf.tidy(() => tf.relu(x.matMul(W1)));
    const shard2 = (h: tf.Tensor) => tf.tidy(() => h.matMul(W2));
    const lossOf = (z: tf.Tensor) => tf.sum(tf.square(z.sub(y))) as tf.Scalar;
    const single = tf.variableGrads(() => lossOf(shard2(shard1(X))), [W1, W2, X]);
    // torch's ResNetShard1/2.forward(x_rref): x = x_rref.to_here(), inside the forward.
    class Shard {
      constructor(private readonly layer: (x: tf.Tensor) => tf.Tensor) {}
      async forward(r: RRef<tf.Tensor>): Promise<tf.Tensor> {
        return this.layer(await r.toHere());
      }
    }
    const set = await agents(3, () => ({ Shard1: () => new Shard(shard1), Shard2: () => new Shard(shard2) }));
    const [master, one, two] = set.all;
    const p1 = master!.remote<Shard>(1, 'Shard1');
    const p2 = master!.remote<Shard>(2, 'Shard2');
    // The shards are done with their own work: their graceful shutdowns begin now, and wait for the master's.
    const shardsDown = [one!.shutdown(), two!.shutdown()];
    let grads: tf.Tensor[] = [];
    await master!.autograd.context(async (ctx) => {
      // x_rref = RRef(x); y_rref = self.p1_rref.remote().forward(x_rref); z_fut = self.p2_rref.rpc_async().forward(y_rref)
      const xRef = master!.localRRef(X);
      const yRef = p1.remote().forward(xRef);
      const z = await p2.rpcAsync().forward(yRef);
      await master!.autograd.backward(ctx, () => lossOf(z));
      grads = [
        one!.autograd.getGradients(ctx).get(W1),
        two!.autograd.getGradients(ctx).get(W2),
        master!.autograd.getGradients(ctx).get(X),
      ].map((g, i) => {
        if (!g) throw new Error(`no gradient for ${['W1 on shard 1', 'W2 on shard 2', 'X on the master'][i]}`);
        return g.clone();
      });
      xRef.release();
      yRef.release();
    });
    for (const [i, name] of ['rpc_pipe_W1', 'rpc_pipe_W2', 'rpc_pipe_X'].entries()) {
      const want = await single.grads[name]!.data();
      const got = await grads[i]!.data();
      let diff = 0;
      let norm = 0;
      for (let k = 0; k < want.length; k++) {
        diff += (got[k]! - want[k]!) ** 2;
        norm += want[k]! ** 2;
      }
      expect(Math.sqrt(diff / norm), name).toBeLessThanOrEqual(1e-6);
    }
    p1.release();
    p2.release();
    // Shard 2's fork of shard 1's output lives until collected, or until the graceful shutdown ends it.
    await Promise.all([master!.shutdown(), ...shardsDown]);
    for (const a of set.all) expect(a.ownedRRefs()).toEqual([]);
    tf.dispose([...grads, ...Object.values(single.grads), single.value, W1, W2, X, y]);
    await Promise.all(set.pgs.map((pg) => pg.destroy()));
  });
});

describe('rpc: RemoteModule and DistributedOptimizer', () => {
  /** A linear layer whose parameters are variables of the worker that makes it. */
  class Linear {
    readonly w: tf.Variable;
    readonly b: tf.Variable;
    constructor(seed: number) {
      this.w = tf.variable(tf.randomNormal([3, 2], 0, 1, 'float32', seed));
      this.b = tf.variable(tf.zeros([2]));
    }
    forward(x: tf.Tensor): tf.Tensor {
      return tf.tidy(() => x.matMul(this.w).add(this.b));
    }
    parameters(): tf.Variable[] {
      return [this.w, this.b];
    }
  }

  it('a module made on another worker is called from here; DistributedOptimizer steps its parameters there as SGD does in one tab', async () => {
    const made: Linear[] = [];
    const set = await agents(2, () => ({
      linear: (seed: number) => {
        made.push(new Linear(seed));
        return made.at(-1);
      },
    }));
    const driver = set.all[0]!;
    const module = new RemoteModule<Linear>('worker1', 'linear', [7], driver);
    const params = await module.remoteParameters();
    expect(params.map((p) => p.ownerName())).toEqual(['worker1', 'worker1']);
    expect(set.all[1]!.ownedRRefs().map((o) => o.forks)).toEqual([1, 1, 1]);
    const reference = new Linear(7);
    const x = tf.randomNormal([4, 3], 0, 1, 'float32', 8);
    const y = tf.randomNormal([4, 2], 0, 1, 'float32', 9);
    const lossOf = (out: tf.Tensor) => tf.mean(tf.square(out.sub(y))) as tf.Scalar;
    const optimizer = new DistributedOptimizer(SGD, params, { lr: 0.1 }, driver);
    const local = new SGD({ lr: 0.1 });
    for (let step = 0; step < 3; step++) {
      await driver.autograd.context(async (ctx) => {
        const out = (await module.forward(x)) as tf.Tensor;
        await driver.autograd.backward(ctx, () => lossOf(out));
        await optimizer.step(ctx);
      });
      // One tab: the same step with the same host optimizer.
      const { grads } = tf.variableGrads(() => lossOf(reference.forward(x)), reference.parameters());
      const flat = async (ts: tf.Tensor[]) => Float32Array.from((await Promise.all(ts.map((t) => t.data()))).flatMap((d) => Array.from(d)));
      const p = await flat(reference.parameters());
      local.stepFlat(p, await flat(reference.parameters().map((v) => grads[v.name]!)), [
        { shape: [3, 2], offset: 0, size: 6 },
        { shape: [2], offset: 6, size: 2 },
      ]);
      reference.w.assign(tf.tensor(p.subarray(0, 6), [3, 2]));
      reference.b.assign(tf.tensor(p.subarray(6), [2]));
      tf.dispose(Object.values(grads));
    }
    const remote = made[0]!;
    for (const [got, want] of [
      [remote.w, reference.w],
      [remote.b, reference.b],
    ] as const) {
      const g = await got.data();
      const w = await want.data();
      for (let k = 0; k < w.length; k++) expect(Math.abs(g[k]! - w[k]!)).toBeLessThanOrEqual(1e-6 * Math.max(1, Math.abs(w[k]!)));
    }
    for (const p of params) p.release();
    module.release();
    await waitFor('the owner to delete the module and its parameter references', () => set.all[1]!.ownedRRefs().length === 0);
    expect(remote.w.isDisposed).toBe(false);
    tf.dispose([x, y, reference.w, reference.b, remote.w, remote.b]);
    await close(set);
  });
});
