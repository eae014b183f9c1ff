/**
 * No sample crosses the wire with localData: over a whole run, what each rank sends its peers
 * (frames by kind) and what every socket sends the server and the server sends on (messages by
 * type), with N and then 4N samples per rank. Only gradients (and the start's weights), votes,
 * counts and signals travel: the same kinds, sizes that do not grow with the samples, and no
 * sample's bytes (nor its decimal text) anywhere.
 */
import * as tf from '@tensorflow/tfjs';
import { WebSocket as NodeSocket } from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { LocalDataset } from '../src/datasets/local.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import type { PeerLinkFactory } from '../src/transport/peer_link.ts';
import { FrameKind, HEADER_BYTES } from '../src/wire/framing.ts';
import { withServer } from './fixtures/server.ts';
import { uniqueSession } from './fixtures/session.ts';
import { INPUT, localMember, localSamples } from './fixtures/local_data.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300 });
});
afterAll(async () => {
  await server.close();
});

interface Traffic {
  /** Per member: frame kind -> [frames, bytes]. */
  frames: Array<Map<number, [number, number]>>;
  /** Socket messages by sender ('client' or 'server') and type -> [messages, bytes]. */
  messages: Map<string, [number, number]>;
  /** Every byte sent, to search for samples. */
  binary: Uint8Array[];
  text: string[];
}

const add = (m: Map<string | number, [number, number]>, key: string | number, bytes: number) => {
  const [n, b] = m.get(key) ?? [0, 0];
  m.set(key, [n + 1, b + bytes]);
};

/** A run of 2 ranks with `samples` each, 4 steps of 2 x 2 samples, everything sent counted. */
async function run(samples: number): Promise<{ traffic: Traffic; datas: LocalDataset[] }> {
  const traffic: Traffic = { frames: [new Map(), new Map()], messages: new Map(), binary: [], text: [] };
  const send = NodeSocket.prototype.send;
  // Both ends of every socket in this process are ws's: the server's are marked _isServer.
  NodeSocket.prototype.send = function (this: NodeSocket & { _isServer?: boolean }, data: unknown, ...rest: unknown[]) {
    const text = typeof data === 'string' ? data : null;
    let type = 'binary';
    if (text !== null) {
      traffic.text.push(text);
      try {
        type = String((JSON.parse(text) as { type?: unknown }).type ?? 'untyped');
      } catch {
        type = 'not-json';
      }
    } else if (data instanceof Uint8Array) traffic.binary.push(data);
    const bytes = text !== null ? Buffer.byteLength(text) : (data as Uint8Array).byteLength;
    add(traffic.messages as Map<string | number, [number, number]>, `${this._isServer ? 'server' : 'client'}:${type}`, bytes);
    return (send as (...a: unknown[]) => void).call(this, data, ...rest);
  } as typeof NodeSocket.prototype.send;
  try {
    const net = new MemoryNetwork();
    const session = uniqueSession('local-wire');
    const datas = [localSamples(samples, 1), localSamples(samples, 2)];
    const counted = (id: number): PeerLinkFactory => {
      const make = net.factoryFor(id);
      return (o) => {
        const link = make(o) as ReturnType<PeerLinkFactory> & { intercept?: (b: Uint8Array) => Uint8Array[] };
        link.intercept = (bytes) => {
          traffic.binary.push(bytes.slice());
          add(traffic.frames[id]! as Map<string | number, [number, number]>, bytes[1]!, bytes.length);
          return [bytes];
        };
        return link;
      };
    };
    const members = datas.map((d, id) =>
      localMember(server.url, net, id, session, d, {
        min: 2,
        max: 2,
        batchSize: 2,
        steps: 4,
        linkFactory: counted(id),
        // No heartbeat falls due in so short a run: the messages are the run's own, the same in both.
        heartbeatIntervalMs: 60_000,
      }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    // A run that ends mid-epoch evaluates at its end (each rank's own held-out samples: none here).
    for (const r of runs) expect(r.localEvaluation?.group).toEqual({ correct: 0, count: 0, accuracy: null });
    await Promise.all(runs.map((r) => r.close()));
    return { traffic, datas };
  } finally {
    NodeSocket.prototype.send = send;
  }
}

/** Whether `needle` occurs in `hay`. */
function contains(hay: Uint8Array, needle: Uint8Array): boolean {
  outer: for (let i = 0; i + needle.length <= hay.length; i++) {
    for (let j = 0; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return true;
  }
  return false;
}

const x0 = (d: LocalDataset) => d.batch([0]).x;

describe('localData on the wire', () => {
  it('only gradients, votes, counts and signals travel, in sizes that do not grow with the samples; no sample anywhere', async () => {
    const small = await run(16);
    const large = await run(64);
    for (const [id, frames] of large.traffic.frames.entries()) {
      // Peer frames: collectives (the gradients, the start's weights), liveness and goodbyes, nothing else.
      for (const kind of frames.keys()) expect([FrameKind.collective, FrameKind.alive, FrameKind.bye]).toContain(kind);
      for (const kind of [FrameKind.alive, FrameKind.bye]) {
        const [n, bytes] = frames.get(kind) ?? [0, 0];
        expect(bytes).toBe(n * HEADER_BYTES);
      }
      // 4x the samples: the very same collective frames.
      expect(frames.get(FrameKind.collective)).toEqual(small.traffic.frames[id]!.get(FrameKind.collective));
      expect(frames.get(FrameKind.collective)![0]).toBeGreaterThan(0);
    }
    // Socket messages: the same types and counts, sizes apart by a few digits (the counts exchanged).
    expect([...large.traffic.messages.keys()].sort()).toEqual([...small.traffic.messages.keys()].sort());
    for (const [type, [n, bytes]] of large.traffic.messages) {
      const [n0, bytes0] = small.traffic.messages.get(type)!;
      expect([type, n]).toEqual([type, n0]);
      expect(Math.abs(bytes - bytes0)).toBeLessThanOrEqual(2 * n);
    }
    // The counts went through the server: one gather row per rank per epoch's rest, beside the votes.
    expect(large.traffic.messages.get('client:gather')![0]).toBeGreaterThan(0);
    // No sample's bytes in any frame or binary message, nor its first value's decimals in any text.
    for (const d of large.datas) {
      const { x } = d.batch(Array.from({ length: d.length }, (_, i) => i));
      for (let i = 0; i < d.length; i++) {
        const bytes = new Uint8Array(x.buffer, i * INPUT * 4, 16);
        expect(large.traffic.binary.some((b) => contains(b, bytes))).toBe(false);
        const decimals = String(x[i * INPUT]);
        expect(large.traffic.text.some((t) => t.includes(decimals))).toBe(false);
      }
    }
    // The search finds a sample where there is one.
    expect(contains(new Uint8Array(x0(large.datas[0]!).buffer), new Uint8Array(x0(large.datas[0]!).buffer, 4, 16))).toBe(true);
  });
});
