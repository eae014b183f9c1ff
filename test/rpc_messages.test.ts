/**
 * The RPC framework's bytes from a peer, every one untrusted (src/rpc/codec.ts, messages.ts), and
 * a hostile member that speaks the protocol: it may act only on references it holds and name
 * only itself. Real server, in-memory links.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { RpcAgent } from '../src/rpc/agent.ts';
import { decodeMessage, encodeMessage, MAX_DEPTH, type RRefCodec } from '../src/rpc/codec.ts';
import { RpcRemoteError, RpcSerializationError } from '../src/rpc/errors.ts';
import { checkHead } from '../src/rpc/messages.ts';
import { withServer } from './fixtures/server.ts';
import { memoryGroups } from './fixtures/memory_groups.ts';
import { waitFor } from './fixtures/wait.ts';

const noRRefs: RRefCodec<never> = {
  toWire: () => undefined,
  fromWire: () => {
    throw new Error('no RRefs here');
  },
};

async function encode(values: Record<string, unknown>, head: Record<string, unknown> = { t: 'done' }): Promise<Uint8Array> {
  return encodeMessage(head, values, noRRefs, 1);
}

/** A message whose JSON head is `head`, with `tail` bytes of attachments. */
function raw(head: unknown, tail = new Uint8Array(0)): Uint8Array {
  const json = new TextEncoder().encode(JSON.stringify(head));
  const start = Math.ceil((8 + json.length) / 8) * 8;
  const out = new Uint8Array(start + tail.length);
  const v = new DataView(out.buffer);
  v.setUint32(0, 0x52504331, true);
  v.setUint32(4, json.length, true);
  out.set(json, 8);
  out.set(tail, start);
  return out;
}

describe('rpc codec: what a peer sends', () => {
  beforeAll(async () => {
    await tf.setBackend('cpu');
  });

  it('round-trips user objects that look like its own markers, unchanged', async () => {
    const value = { $t: 0, $r: { owner: 0, id: '0.1', fork: '0.0.1' }, nested: [{ $o: 1 }, { $a: 'x', kind: 'f32' }] };
    const m = decodeMessage(await encode({ args: value }));
    expect(m.value('args', noRRefs, 1)).toEqual(value);
  });

  it('refuses short, foreign and malformed messages, naming what is wrong', () => {
    const bad = (bytes: Uint8Array) => () => decodeMessage(bytes);
    expect(bad(new Uint8Array(4))).toThrow(RpcSerializationError);
    expect(bad(new Uint8Array(16))).toThrow('not an RPC message (wrong magic)');
    const lying = raw({ t: 'done', att: [] });
    new DataView(lying.buffer).setUint32(4, 10_000, true);
    expect(bad(lying)).toThrow('its head says 10000 bytes of JSON');
    expect(bad(raw([1, 2]))).toThrow('its head is not a JSON object');
    expect(bad(raw({ t: 'done' }))).toThrow('its attachment list is missing or too long');
    expect(bad(raw({ t: 'done', att: [{ offset: 0, bytes: 64 }] }, new Uint8Array(8)))).toThrow('attachment 0 is outside the message');
  });

  it('refuses tensors whose bytes do not match their shape and dtype, unknown dtypes, and bad references to attachments', () => {
    const tail = new Uint8Array(8);
    const value = (v: unknown) => () =>
      decodeMessage(raw({ t: 'done', att: [{ offset: 0, bytes: 8 }], args: v }, tail)).value('args', noRRefs, 1);
    expect(value({ $t: 0, dtype: 'float32', shape: [3] })).toThrow('a float32 tensor of shape [3] needs 12 bytes, got 8');
    expect(value({ $t: 0, dtype: 'complex64', shape: [1] })).toThrow('tensor dtype "complex64" is not float32, int32 or bool');
    expect(value({ $t: 5, dtype: 'float32', shape: [2] })).toThrow('attachment 5 does not exist');
    expect(value({ $t: 0, dtype: 'float32', shape: [-2, -1] })).toThrow('a tensor shape is a list of at most 8 sizes >= 0');
    expect(value({ $a: 0, kind: 'f64' })).toThrow('array kind "f64" is not f32, i32 or u8');
    expect(value({ $n: 'eval' })).toThrow('"eval" is not a number');
    expect(value({ $r: { owner: -1, id: 7 } })).toThrow('an RRef reference needs an owner rank, an id and a fork');
    expect(value(JSON.parse('{"__proto__": {"polluted": 1}}'))).toThrow('the key "__proto__" is refused');
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('bounds nesting on both ends', async () => {
    let deep: unknown = 1;
    for (let i = 0; i <= MAX_DEPTH + 1; i++) deep = [deep];
    await expect(encode({ args: deep })).rejects.toThrow(`nested deeper than ${MAX_DEPTH} levels`);
    let text = '1';
    for (let i = 0; i <= MAX_DEPTH + 1; i++) text = `[${text}]`;
    expect(() => decodeMessage(raw({ t: 'done', att: [], args: JSON.parse(text) })).value('args', noRRefs, 1)).toThrow(
      `nested deeper than ${MAX_DEPTH} levels`,
    );
  });

  it('checks every head before the agent acts on it: types, ids, names, references', () => {
    expect(checkHead({ t: 'call', id: 1, fn: 'f' })).toEqual({ t: 'call', id: 1, fn: 'f' });
    expect(() => checkHead({ t: 'exec', code: 'x' })).toThrow('an RPC message has unknown type "exec"');
    expect(() => checkHead({ t: 'call', id: 0, fn: 'f' })).toThrow('has no valid "id"');
    expect(() => checkHead({ t: 'call', id: 1, fn: 'x'.repeat(201) })).toThrow('has no valid "fn"');
    expect(() => checkHead({ t: 'hello', name: 'a b' })).toThrow('has no valid "name"');
    expect(() => checkHead({ t: 'release', rref: '0.1', fork: 'mine' })).toThrow('has no valid "fork"');
    expect(() => checkHead({ t: 'grad', id: 1, ctx: '0.1', key: 'z:1', index: 0 })).toThrow('has no valid "key"');
    expect(() => checkHead({ t: 'call', id: 1, fn: 'f', ctx: 'x' })).toThrow('has no valid "ctx"');
  });
});

describe('rpc: a hostile member that speaks the protocol', () => {
  let server: RunningServer;
  beforeAll(async () => {
    server = await withServer();
  });
  afterAll(async () => {
    await server.close();
  });

  it('cannot release, fetch or fork a reference it does not hold, create ids or call or fetch in contexts in another name, or rename a worker', async () => {
    const { pgs } = await memoryGroups(server.url, 3, 'rpc-hostile');
    const [owner, user] = [0, 1].map((r) => new RpcAgent(pgs[r]!.openMessageChannel(), 3, { name: `w${r}` }));
    owner!.register('box', () => ({ x: 1 }));
    // Rank 2 speaks the protocol by hand over its own channel.
    const hostile = pgs[2]!.openMessageChannel();
    const replies: Array<Record<string, unknown>> = [];
    hostile.onMessage((_from, bytes) => {
      const head = decodeMessage(bytes).head;
      if (head.t === 'reply') replies.push(head);
    });
    const send = async (to: number, head: Record<string, unknown>, values: Record<string, unknown> = {}) =>
      hostile.send(to, await encodeMessage(head, values, noRRefs, to));
    // Together: a link opens once both ends ask for it (the agents' start does).
    await Promise.all([send(0, { t: 'hello', name: 'w2' }), send(1, { t: 'hello', name: 'w2' }), owner!.start(5_000), user!.start(5_000)]);

    const rref = user!.remote('w0', 'box');
    expect(await rref.toHere()).toEqual({ x: 1 });
    const { id } = rref;
    const before = owner!.ownedRRefs();
    await send(0, { t: 'release', rref: id, fork: rref.fork }); // worker 1's fork, in rank 2's name
    await send(0, { t: 'fetch', id: 1, rref: id });
    await send(0, { t: 'fork', id: 2, rref: id, fork: '2.2.1' });
    await send(0, { t: 'call', id: 3, fn: 'box', rref: { id: '1.99', fork: '2.2.2' } }, { args: [] }); // an id in rank 1's name
    await send(0, { t: 'call', id: 4, fn: 'box', ctx: '1.1' }, { args: [] }); // in rank 1's autograd context
    await send(0, { t: 'hello', name: 'w0' }); // a second name, someone else's
    await waitFor('the owner to answer the four requests', () => replies.length === 4);
    expect(replies.map((r) => (r.error as { message: string }).message)).toEqual([
      `worker w2 holds no reference to RRef ${id} here`,
      `worker w2 holds no reference to RRef ${id} here`,
      'rank 2 may create only RRef ids and forks of its own',
      'rank 2 may call only in distributed autograd contexts of its own, not 1.1',
    ]);
    expect(owner!.ownedRRefs()).toEqual(before);
    expect(owner!.workerInfos().map((w) => w.name)).toEqual(['w0', 'w1', 'w2']);
    expect(await rref.toHere()).toEqual({ x: 1 });
    // A reference of its own, fetched in another's context open on the owner: refused (only a
    // context's creator lets a worker in, by passing it a reference in that context).
    await send(0, { t: 'call', id: 5, fn: 'box', rref: { id: '2.1', fork: '2.2.1' } }, { args: [] });
    let ctx = '';
    await user!.autograd.context(async (id) => {
      ctx = id;
      await user!.rpcAsync('w0', 'box');
      await send(0, { t: 'fetch', id: 6, rref: '2.1', ctx: id });
      await waitFor('the owner to answer the fetch', () => replies.length === 6);
    });
    expect(replies[4]!.error).toBeUndefined();
    expect((replies[5]!.error as { message: string }).message).toBe(
      `rank 2 may call only in distributed autograd contexts of its own, not ${ctx}`,
    );
    await Promise.all([owner!.shutdown({ graceful: false }), user!.shutdown({ graceful: false })]);
    await Promise.all(pgs.map((pg) => pg.destroy()));
  });
  it("has each caller's share of a worker's RRefs and autograd contexts bounded apart: a member that fills its own leaves the others served", async () => {
    const { pgs } = await memoryGroups(server.url, 3, 'rpc-shares');
    const owner = new RpcAgent(pgs[0]!.openMessageChannel(), 3, { name: 'w0', maxOwnedRRefs: 4, maxAutogradContexts: 2 });
    const user = new RpcAgent(pgs[1]!.openMessageChannel(), 3, { name: 'w1' });
    owner.register('box', () => ({ x: 1 }));
    const hostile = pgs[2]!.openMessageChannel();
    const replies = new Map<number, Record<string, unknown>>();
    hostile.onMessage((_from, bytes) => {
      const head = decodeMessage(bytes).head;
      if (head.t === 'reply') replies.set(head.id as number, head);
    });
    const send = async (to: number, head: Record<string, unknown>) =>
      hostile.send(to, await encodeMessage(head, { args: [] }, noRRefs, to));
    await Promise.all([send(0, { t: 'hello', name: 'w2' }), send(1, { t: 'hello', name: 'w2' }), owner.start(5_000), user.start(5_000)]);

    // Rank 2 makes the owner keep 5 values in its own name and opens 3 contexts there, ending none.
    for (let n = 1; n <= 5; n++) await send(0, { t: 'call', id: n, fn: 'box', rref: { id: `2.${n}`, fork: `2.2.${n}` } });
    for (let n = 1; n <= 3; n++) await send(0, { t: 'call', id: 10 + n, fn: 'box', ctx: `2.${n}` });
    await waitFor('the owner to answer the eight requests', () => replies.size === 8);
    const refused = [...replies.values()].filter((r) => r.error).map((r) => r.error as { type: string; message: string });
    expect(refused).toEqual([
      {
        type: 'RpcLimitError',
        message:
          'w0 already keeps 4 RRef values and references for w2, its bound per caller (maxOwnedRRefs): release RRefs it no longer needs (rref.release()) before making more, or raise maxOwnedRRefs on the owner',
      },
      {
        type: 'RpcLimitError',
        message:
          'w0 already keeps 2 distributed autograd contexts for w2, its bound per caller (maxAutogradContexts): end its contexts (distAutograd.context returns) before opening more, or raise maxAutogradContexts',
      },
    ]);
    expect(owner.ownedRRefs()).toHaveLength(4);

    // Another caller has its whole share: 4 values, and contexts.
    const refs = Array.from({ length: 4 }, () => user.remote<{ x: number }>('w0', 'box'));
    for (const r of refs) expect(await r.toHere()).toEqual({ x: 1 });
    for (let i = 0; i < 2; i++) await user.autograd.context(async () => expect(await user.rpcAsync('w0', 'box')).toEqual({ x: 1 }));
    // Its fifth is refused in its own name, and the RRef says why.
    const fifth = user.remote('w0', 'box');
    const err = await fifth.toHere().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(RpcRemoteError);
    expect(err).toMatchObject({ worker: 'w0', fn: 'box', remoteType: 'RpcLimitError' });
    expect((err as Error).message).toContain('w0 already keeps 4 RRef values and references for w1');
    expect(owner.ownedRRefs()).toHaveLength(8);
    await Promise.all([owner.shutdown({ graceful: false }), user.shutdown({ graceful: false })]);
    await Promise.all(pgs.map((pg) => pg.destroy()));
  });
});
