/**
 * A member that sends what an honest one never would: misaligned chunks, frames for collectives
 * far ahead, more bytes than a receive will ever take, a state that does not fit the model, a
 * claim of a huge step at recovery. Each is refused with a typed error naming the rank (in-memory
 * links, real server; TF.js cpu backend).
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { recover, type StateClaim } from '../src/elastic/recovery.ts';
import { FramingError, StateTransferError } from '../src/wire/errors.ts';
import { Collective, FrameKind, HEADER_BYTES, checkChunk, frames, readHeader, writeHeader } from '../src/wire/framing.ts';
import { Mailbox } from '../src/transport/mailbox.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { weightsHash } from '../src/parallel/replicas.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { sleep, waitFor } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { watchCollectiveFrames } from './fixtures/links.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(
  n: number,
  extra: { maxFrameBytes?: number; peerTimeoutMs?: number } = {},
): Promise<{ pgs: ProcessGroup[]; net: MemoryNetwork }> {
  const session = uniqueSession('hostile');
  const net = new MemoryNetwork();
  const pgs = await Promise.all(
    Array.from({ length: n }, (_, rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: n,
        rank,
        timeoutMs: 5_000,
        linkFactory: net.factoryFor(rank),
        ...extra,
      }),
    ),
  );
  return { pgs, net };
}

const destroy = (pgs: ProcessGroup[]) =>
  pgs.forEach((pg) => {
    pg.destroy();
  });

/** A copy of `frame` with header fields changed and its payload cut to the new length. */
function tamper(frame: Uint8Array, change: { offset?: number; length?: number; seq?: number }): Uint8Array {
  const h = { ...readHeader(frame), ...change };
  const out = new Uint8Array(HEADER_BYTES + h.length);
  writeHeader(out, h);
  out.set(frame.subarray(HEADER_BYTES, HEADER_BYTES + h.length), HEADER_BYTES);
  return out;
}

/** Runs one all-reduce on every rank while rank 0's first frame to rank 1 is replaced by `bad(frame)`. */
async function allReduceWithBadFrame(bad: (frame: Uint8Array) => Uint8Array): Promise<PromiseSettledResult<Float32Array>[]> {
  const { pgs, net } = await groups(2, { peerTimeoutMs: 5_000 });
  await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(4))));
  let first = true;
  net.end(0, 1)!.intercept = (f) => {
    if (!first) return [f];
    first = false;
    return [bad(f)];
  };
  const results = await Promise.allSettled(pgs.map((pg) => pg.allReduce(new Float32Array(8))));
  destroy(pgs);
  return results;
}

function rejection(r: PromiseSettledResult<unknown>): Error {
  expect(r.status).toBe('rejected');
  return (r as PromiseRejectedResult).reason as Error;
}

describe('peer frames', () => {
  it('a chunk whose offset or length is not a multiple of 4 bytes is refused, naming the field', () => {
    const [f] = [
      ...frames(new Uint8Array(16), {
        kind: FrameKind.collective,
        group: 0,
        collective: Collective.allReduce,
        reduceOp: 0,
        seq: 1,
        step: 0,
        numel: 4,
        root: 0,
      }),
    ];
    expect(() => checkChunk(readHeader(tamper(f!, { offset: 2, length: 12 })))).toThrow(
      errorOf(FramingError, /chunk offset 2 is not a multiple of 4 bytes/),
    );
    expect(() => checkChunk(readHeader(tamper(f!, { length: 6 })))).toThrow(
      errorOf(FramingError, /chunk length 6 is not a multiple of 4 bytes/),
    );
    expect(() => checkChunk(readHeader(f!))).not.toThrow();
  });

  for (const [field, change] of [
    ['offset', { offset: 2, length: 4 }],
    ['length', { length: 6 }],
  ] as const) {
    it(`a misaligned ${field} from a peer fails the collective on every rank, naming the peer and the field`, async () => {
      const results = await allReduceWithBadFrame((f) => tamper(f, change));
      const atReceiver = rejection(results[1]!) as FramingError;
      expect(atReceiver).toBeInstanceOf(FramingError);
      expect(atReceiver.rank).toBe(0);
      expect(atReceiver.field).toBe(field);
      expect(atReceiver.message).toMatch(new RegExp(`bad frame from rank 0: chunk ${field} \\d+ is not a multiple of 4 bytes`));
      expect(rejection(results[0]!)).toBeInstanceOf(FramingError); // told by rank 1's abort notice
    });
  }

  it('a frame for a collective far ahead is refused at once, not buffered', async () => {
    const t0 = Date.now();
    const results = await allReduceWithBadFrame((f) => tamper(f, { seq: readHeader(f).seq + 1_000 }));
    const err = rejection(results[1]!) as FramingError;
    expect(err).toBeInstanceOf(FramingError);
    expect(err).toMatchObject({ rank: 0, field: 'seq' });
    expect(err.message).toMatch(/collective #1002 is outside the window of 64 past #2, the last this rank issued; refused, not buffered/);
    expect(rejection(results[0]!)).toBeInstanceOf(FramingError);
    expect(Date.now() - t0).toBeLessThan(3_000); // no wait for a peer timeout
  });

  it('collectives a peer legitimately runs ahead with (as DDP pipelines its buckets) are still buffered', async () => {
    const { pgs, net } = await groups(2);
    await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(4)))); // opens the link, so its frames can be watched
    const link = net.end(0, 1)!;
    const sent = watchCollectiveFrames(link);
    const ahead = Array.from({ length: 20 }, () => pgs[0]!.allReduce(new Float32Array(1000).fill(1)));
    // Rank 1 holds frames of all 20 before it issues any: they were buffered, not met by a receive.
    await waitFor("rank 0's frames of all 20 collectives to reach rank 1", () => sent.seqs.size === 20 && link.buffered === 0);
    const behind = Array.from({ length: 20 }, () => pgs[1]!.allReduce(new Float32Array(1000).fill(2)));
    for (const out of await Promise.all([...ahead, ...behind])) expect(out[999]).toBe(3);
    destroy(pgs);
  });
});

describe('mailbox bounds', () => {
  const frameFor = (seq: number, step = 0, bytes = 16) =>
    [
      ...frames(new Uint8Array(bytes), {
        kind: FrameKind.collective,
        group: 0,
        collective: Collective.allReduce,
        reduceOp: 0,
        seq,
        step,
        numel: bytes / 4,
        root: 0,
      }),
    ][0]!;
  const mailbox = () =>
    new Mailbox(
      1,
      60_000,
      () => {},
      { maxSeqAhead: 4, maxStep: 2, maxBufferedBytes: 200 },
      () => 10,
    );
  const put = (mb: Mailbox, f: Uint8Array) => mb.put(0, f, readHeader(f));

  it('buffers frames up to maxSeqAhead past the last issued collective, and refuses the next', () => {
    const mb = mailbox();
    expect(() => put(mb, frameFor(14))).not.toThrow();
    expect(() => put(mb, frameFor(15))).toThrow(FramingError);
    expect(() => put(mb, frameFor(0))).toThrow(errorOf(FramingError, /collective #0 is outside the window/));
  });

  it('refuses message numbers no collective of the group has', () => {
    expect(() => put(mailbox(), frameFor(11, 2))).toThrow(
      errorOf(FramingError, /message step 2 of collective #11 is past the last a collective has \(1\)/),
    );
  });

  it('bounds the bytes one peer can make this rank hold over all the groups they share, and a broken group gives its part back', () => {
    const shared = new Map<number, number>();
    const inGroup = () =>
      new Mailbox(
        1,
        60_000,
        () => {},
        { maxSeqAhead: 4, maxStep: 2, maxBufferedBytes: 200 },
        () => 10,
        '',
        shared,
      );
    const [a, b] = [inGroup(), inGroup()];
    put(a, frameFor(11, 0, 64)); // 100 bytes with the header
    put(b, frameFor(11, 0, 64)); // 200 over both groups
    expect(() => put(b, frameFor(12, 0, 64))).toThrow(errorOf(FramingError, /300 bytes would wait/));
    a.failAll(new Error('group destroyed'));
    expect(() => put(b, frameFor(12, 0, 64))).not.toThrow();
  });

  it('gives a message a deadline as a whole: a peer dripping chunks cannot hold a receive for ever', async () => {
    const lost: string[] = [];
    const mb = new Mailbox(
      1,
      100,
      (_peer, why) => lost.push(why),
      { maxSeqAhead: 4, maxStep: 2, maxBufferedBytes: 1 << 16 },
      () => 10,
    );
    const chunks = [
      ...frames(
        new Uint8Array(64),
        { kind: FrameKind.collective, group: 0, collective: Collective.allReduce, reduceOp: 0, seq: 11, step: 0, numel: 16, root: 0 },
        16 + HEADER_BYTES,
      ),
    ];
    const d = { collective: Collective.allReduce, reduceOp: 0, numel: 16, root: 0 } as const;
    void mb.receive(0, FrameKind.collective, 11, 0, d, 64, () => {}, Promise.resolve()).catch(() => {});
    // A chunk every 60 ms re-arms the 100 ms silence timer each time; the message's 104 ms do not wait.
    for (const chunk of chunks.slice(0, 3)) {
      await sleep(60); // the behaviour under test: a chunk every 60 ms
      if (lost.length > 0) break;
      put(mb, chunk);
    }
    expect(lost[0]).toMatch(/did not finish sending allReduce.* #11 step 0 \(64 bytes\) within 104 ms/);
  });

  it('bounds the bytes one peer can make it hold, and frees them when a receive takes them', async () => {
    const mb = mailbox();
    put(mb, frameFor(11, 0, 64)); // 96 bytes with the header
    put(mb, frameFor(12, 0, 64)); // 192
    let err: unknown;
    try {
      put(mb, frameFor(13, 0, 64)); // 288 > 200
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(FramingError);
    expect(err).toMatchObject({ rank: 0, field: 'buffered' });
    const got = new Uint8Array(64);
    const d = { collective: Collective.allReduce, reduceOp: 0, numel: 16, root: 0 } as const;
    await mb.receive(0, FrameKind.collective, 11, 0, d, 64, (p, o) => got.set(p, o), Promise.resolve());
    expect(() => put(mb, frameFor(13, 0, 64))).not.toThrow(); // 96 freed
  });
});

// ---------------------------------------------------------------------------------------------
// Recovery: who becomes the source, and what a receiver accepts.

const mlp = (seed: number, hidden = 32) => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed, hidden });
const trainState = (seed: number, step: number, hidden = 32) => {
  const s = new TrainState({ model: mlp(seed, hidden), optimizer: () => tf.train.sgd(0.1) });
  s.progress = { step, epoch: 0, position: step * 8 };
  return s;
};
/** Used only when nobody has live state (a checkpoint is then looked for): not in these tests. */
const options = () => ({ url: server.url, session: 'unused', token: tokenFor('unused') });
const run = () => ({ generations: 1, stepsRedone: 0, resumes: [] });
/** A survivor's claim: it held the state in an earlier round of this server instance. */
const survivor = (pg: ProcessGroup): StateClaim => ({ live: true, inFlight: -1, heldIn: { instance: pg.instance, round: pg.round - 1 } });

describe('recovery source', () => {
  it('a joiner claiming a huge step does not become the source, before or after the survivor', async () => {
    for (const joinerRank of [0, 1]) {
      const { pgs } = await groups(2);
      const survivorRank = 1 - joinerRank;
      const states = pgs.map((pg) => (pg.rank === joinerRank ? trainState(7, 1_000_000) : trainState(3, 5)));
      const survivorHash = await weightsHash(states[survivorRank]!.model);
      // The joiner holds state from somewhere else (another server, say) and claims a huge step.
      // As rank 0 it comes before the survivor, as a fixed group's asked-for rank could.
      const joinerClaim: StateClaim = { live: true, inFlight: -1, heldIn: { instance: 'elsewhere', round: 99 } };
      const results = await Promise.all(
        pgs.map((pg) => recover(pg, states[pg.rank]!, run(), pg.rank === joinerRank ? joinerClaim : survivor(pg), options())),
      );
      for (const [r, result] of results.entries()) {
        expect(result).toMatchObject({ source: 'replica', from: survivorRank, redone: false });
        expect(states[r]!.progress.step).toBe(5);
        expect(await weightsHash(states[r]!.model)).toBe(survivorHash);
      }
      destroy(pgs);
    }
  });

  it('a joiner that also claims a round of this server loses to the survivor listed before it', async () => {
    const { pgs } = await groups(3);
    const states = pgs.map((pg) => (pg.rank === 2 ? trainState(7, 1_000_000) : trainState(3, 5)));
    const results = await Promise.all(pgs.map((pg) => recover(pg, states[pg.rank]!, run(), survivor(pg), options())));
    expect(results.map((r) => r.from)).toEqual([0, 0, 0]);
    expect(states.map((s) => s.progress.step)).toEqual([5, 5, 5]);
    destroy(pgs);
  });

  it('survivors one step apart: the lowest rank is the source and the step it lacks is trained again', async () => {
    const { pgs } = await groups(2);
    const states = pgs.map((pg) => trainState(3, pg.rank === 0 ? 5 : 6));
    const claims = pgs.map((pg): StateClaim => ({ ...survivor(pg), inFlight: pg.rank === 0 ? 6 : -1 }));
    const results = await Promise.all(pgs.map((pg) => recover(pg, states[pg.rank]!, run(), claims[pg.rank]!, options())));
    for (const r of results)
      expect(r).toMatchObject({
        from: 0,
        redone: true,
        note: 'resumed at step 5 from the replica of rank 0, sent to 1 rank; step 6 is trained again',
      });
    destroy(pgs);
  });
});

describe('state kept, nothing sent', () => {
  const traffic = (net: MemoryNetwork) => net.links.reduce((sum, l) => sum + l.bytesSent, 0);

  it('survivors of one round holding the same state keep it: only the claims travel', async () => {
    const { pgs, net } = await groups(3);
    const states = pgs.map(() => trainState(3, 5));
    const hash = await weightsHash(states[0]!.model);
    const before = traffic(net);
    // Rank 2 had step 6 in flight when the round failed: it is trained again, as after a transfer.
    const claims = pgs.map((pg): StateClaim => ({ ...survivor(pg), inFlight: pg.rank === 2 ? 6 : -1 }));
    const results = await Promise.all(pgs.map((pg) => recover(pg, states[pg.rank]!, run(), claims[pg.rank]!, options())));
    for (const r of results) {
      expect(r).toMatchObject({
        source: 'replica',
        from: 0,
        redone: true,
        transferred: false,
        note: 'resumed at step 5: every rank held the replica of rank 0, nothing sent; step 6 is trained again',
      });
      expect(r.run).toMatchObject({ stepsRedone: 1, resumes: [r.note] });
    }
    // The claims' all-gather: 6 numbers from each of 3 ranks, far less than the model's weights.
    const weightBytes = (await states[0]!.stateDict()).model.weightData.byteLength;
    expect(traffic(net) - before).toBeLessThan(weightBytes / 4);
    for (const s of states) expect(await weightsHash(s.model)).toBe(hash);
    destroy(pgs);
  });

  it("a survivor whose weights differ (same round, same step) gets the source's state", async () => {
    const { pgs } = await groups(3);
    // Rank 1's replica drifted (local SGD, or a bit flipped): its digest differs.
    const states = pgs.map((pg) => trainState(pg.rank === 1 ? 4 : 3, 5));
    const hash = await weightsHash(states[0]!.model);
    const results = await Promise.all(pgs.map((pg) => recover(pg, states[pg.rank]!, run(), survivor(pg), options())));
    for (const r of results)
      expect(r).toMatchObject({ from: 0, transferred: true, note: 'resumed at step 5 from the replica of rank 0, sent to 1 rank' });
    for (const s of states) expect(await weightsHash(s.model)).toBe(hash);
    destroy(pgs);
  });

  it('holders load their own bytes as the receivers load theirs: with Adam, all stay identical over the next steps', async () => {
    const data = syntheticDataset({ length: 48, inputSize: 16, numClasses: 4, seed: 2 });
    const adamStep = (state: TrainState, from: number) => {
      const { x, y } = data.batch(Array.from({ length: 8 }, (_, i) => from + i));
      tf.tidy(() => {
        const xs = tf.tensor(x, [8, 16]);
        const ys = tf.tensor1d(y, 'int32');
        state.optimizer.minimize(() => classificationLoss(state.model.apply(xs) as tf.Tensor, ys, 4));
      });
    };
    const adamState = (seed: number) => new TrainState({ model: mlp(seed), optimizer: () => tf.train.adam(0.01) });
    const { pgs } = await groups(3);
    // Ranks 0 and 1 trained 20 steps together (Adam's running beta powers now differ in the last
    // bit from pow()'s, which a restored Adam uses); rank 2's replica is another (its digest differs).
    const states = pgs.map((pg) => adamState(pg.rank === 2 ? 4 : 3));
    for (const s of states.slice(0, 2)) for (let k = 0; k < 20; k++) adamStep(s, 8 * (k % 6));
    for (const s of states) s.progress = { step: 20, epoch: 0, position: 160 };
    const results = await Promise.all(pgs.map((pg) => recover(pg, states[pg.rank]!, run(), survivor(pg), options())));
    for (const r of results)
      expect(r).toMatchObject({ from: 0, transferred: true, note: 'resumed at step 20 from the replica of rank 0, sent to 1 rank' });
    for (const s of states) for (let k = 0; k < 5; k++) adamStep(s, 8 * k);
    const hashes = await Promise.all(states.map((s) => weightsHash(s.model)));
    expect(new Set(hashes).size).toBe(1);
    destroy(pgs);
  });

  it('with keepSameState false the state is sent even when every rank holds it', async () => {
    const { pgs } = await groups(2);
    const states = pgs.map(() => trainState(3, 5));
    const results = await Promise.all(
      pgs.map((pg) => recover(pg, states[pg.rank]!, run(), survivor(pg), { ...options(), keepSameState: false })),
    );
    for (const r of results) expect(r).toMatchObject({ from: 0, transferred: true });
    destroy(pgs);
  });
});

describe('state transfer', () => {
  it('a state whose weights do not fit the receiving model is refused, naming the sender and the parameter', async () => {
    const { pgs } = await groups(2);
    const states = [trainState(3, 5, 32), trainState(3, 0, 24)];
    const joiner: StateClaim = { live: false, inFlight: -1, heldIn: null };
    const results = await Promise.allSettled(
      pgs.map((pg) => recover(pg, states[pg.rank]!, run(), pg.rank === 0 ? survivor(pg) : joiner, options())),
    );
    const err = rejection(results[1]!) as StateTransferError;
    expect(err).toBeInstanceOf(StateTransferError);
    expect(err.rank).toBe(0);
    expect(err.parameter).toMatch(/^parameter 0 \(.*kernel\)$/);
    expect(err.message).toMatch(
      /state from rank 0 refused: parameter 0 .*: it sends shape \[16, 32\] float32, this model has \[16, 24\] float32/,
    );
    destroy(pgs);
  });

  /**
   * Rank 0 plays a hostile source by hand: it claims live state (of another server instance, so
   * that it is the source as the lowest live rank) and then sends a state transfer of its own
   * through `send`, given how it travels: to one victim point to point (two ranks: few lack the
   * state), or broadcast to three (four ranks: one holder is too few to send to each in turn).
   * Resolves with what the first victim's recovery threw.
   */
  type HostileSend = (pg: ProcessGroup, words: Float32Array[]) => Promise<void>;
  const paths: Array<{ path: string; ranks: number; send: HostileSend }> = [
    {
      path: 'point to point',
      ranks: 2,
      send: async (pg, words) => {
        for (const w of words) await pg.send(w, 1);
      },
    },
    {
      path: 'broadcast',
      ranks: 4,
      send: async (pg, words) => {
        for (const w of words) await pg.broadcast(w, 0);
      },
    },
  ];
  async function hostileSource(ranks: number, send: (pg: ProcessGroup) => Promise<void>): Promise<unknown> {
    const { pgs } = await groups(ranks, { peerTimeoutMs: 2_000 });
    const [evil, ...victims] = pgs as [ProcessGroup, ...ProcessGroup[]];
    const received = victims.map((victim) =>
      recover(victim, trainState(3, 0), run(), { live: false, inFlight: -1, heldIn: null }, options()).then(
        () => new Error('the victim accepted the state'),
        (e: unknown) => e,
      ),
    );
    await evil.allGather(Float32Array.of(5, -1, 12345, 3, -1, -1));
    await send(evil).catch(() => {});
    const errs = await Promise.all(received);
    destroy(pgs);
    return errs[0];
  }

  for (const { path, ranks, send } of paths) {
    it(`a declared header length over the limit is refused before anything is allocated (${path})`, async () => {
      const err = await hostileSource(ranks, (pg) => send(pg, [Float32Array.of(2 ** 30)]));
      expect(err).toBeInstanceOf(StateTransferError);
      expect((err as Error).message).toMatch(
        /state from rank 0 refused: header: a header of 1073741824 4-byte words is not a length up to 16777216 bytes/,
      );
    });

    it(`optimizer tensors the model cannot have, or byte counts their specs do not make, are refused before allocation (${path})`, async () => {
      const honest = await trainState(3, 0).stateDict();
      const header = (optimizerSpecs: unknown[], optimizerBytes: number, modelBytes = honest.model.weightData.byteLength) => ({
        progress: { step: 5, epoch: 0, position: 40 },
        extras: null,
        run: run(),
        modelSpecs: honest.model.weightSpecs,
        modelBytes,
        optimizerSpecs,
        optimizerBytes,
      });
      const sendHeader = (h: unknown) => async (pg: ProcessGroup) => {
        const json = new TextEncoder().encode(JSON.stringify(h));
        const words = new Float32Array(Math.ceil(json.length / 4));
        new Uint8Array(words.buffer).set(json);
        await send(pg, [Float32Array.of(words.length), words]);
      };
      const huge = await hostileSource(ranks, sendHeader(header([{ name: 'm', shape: [100_000, 100_000], dtype: 'float32' }], 4e10)));
      expect(huge).toMatchObject({ name: 'StateTransferError', rank: 0, parameter: 'optimizer tensor 0' });
      const lying = await hostileSource(ranks, sendHeader(header([], 0, 2 ** 31)));
      expect(lying).toMatchObject({ name: 'StateTransferError', parameter: 'model' });
      expect((lying as Error).message).toMatch(/announces 2147483648 bytes of weights, this model's weights take \d+/);
      // A communication hook state bigger than any hook of this model keeps, or malformed.
      const honestHeader = header(honest.optimizer.weightSpecs, honest.optimizer.weightData.byteLength);
      const bigHook = await hostileSource(
        ranks,
        sendHeader({
          ...honestHeader,
          commHookName: 'powerSGD',
          commHook: { name: 'powerSGD', meta: {}, tensors: [{ name: 'q:0/0', length: 2 ** 31 }] },
        }),
      );
      expect(bigHook).toMatchObject({ name: 'StateTransferError', rank: 0, parameter: 'communication hook state' });
      expect((bigHook as Error).message).toMatch(/its tensors hold more than the \d+ values allowed/);
      const oddHook = await hostileSource(
        ranks,
        sendHeader({ ...honestHeader, commHook: { name: 'powerSGD', meta: { x: [1] }, tensors: [] } }),
      );
      expect(oddHook).toMatchObject({ name: 'StateTransferError', parameter: 'communication hook state' });
    });
  }
});
