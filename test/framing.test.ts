/** Framing and reassembly: chunk boundaries, and bad chunks rejected with an error. */
import { describe, expect, it } from 'vitest';
import {
  FrameKind,
  Collective,
  HEADER_BYTES,
  Reassembler,
  frames,
  readHeader,
  writeHeader,
  type FrameHeader,
} from '../src/wire/framing.ts';
import { FramingError, PeerLostError, RankStalledError } from '../src/wire/errors.ts';
import { decodeAbortNotice, encodeAbortNotice } from '../src/transport/mailbox.ts';
import { errorOf } from './fixtures/errors.ts';

const base = {
  kind: FrameKind.collective,
  group: 0,
  collective: Collective.allReduce,
  reduceOp: 0,
  seq: 7,
  step: 2,
  numel: 100,
  root: 0,
} as const;

function payloadOf(n: number): Uint8Array {
  return Uint8Array.from({ length: n }, (_, i) => (i * 31 + 7) & 0xff);
}

function reassemble(list: Uint8Array[], total: number): Uint8Array {
  const out = new Uint8Array(total);
  const r = new Reassembler(total, (p, offset) => out.set(p, offset));
  for (const f of list) r.push(f);
  expect(r.done).toBe(true);
  return out;
}

describe('frames', () => {
  it('round-trips the header', () => {
    const f = new Uint8Array(HEADER_BYTES + 4);
    const h: FrameHeader = { ...base, dtype: 0, total: 400, offset: 396, length: 4 };
    writeHeader(f, h);
    expect(readHeader(f)).toEqual(h);
  });

  it('carries the wire dtype in the high 4 bits of byte 3, the reduce op in the low 4', () => {
    const f = new Uint8Array(HEADER_BYTES + 2);
    const h: FrameHeader = { ...base, reduceOp: 1, dtype: 2, total: 6, offset: 4, length: 2 };
    writeHeader(f, h);
    expect(f[3]).toBe(0x21);
    expect(readHeader(f)).toEqual(h);
    f[3] = 0x31; // int8
    expect(readHeader(f).dtype).toBe(3);
    f[3] = 0x41;
    expect(() => readHeader(f)).toThrow(errorOf(FramingError, /unknown element type 4/));
  });

  it('carries the process group id as a u32 at byte 32 of a 36-byte header', () => {
    expect(HEADER_BYTES).toBe(36);
    const f = new Uint8Array(HEADER_BYTES);
    writeHeader(f, { ...base, group: 0xfffffffe, total: 0, offset: 0, length: 0 });
    expect(new DataView(f.buffer).getUint32(32, true)).toBe(0xfffffffe);
    expect(readHeader(f).group).toBe(0xfffffffe);
    const [g3] = [...frames(payloadOf(8), { ...base, group: 3 })];
    expect(readHeader(g3!)).toMatchObject({ group: 3, seq: 7, total: 8 });
  });

  it('splits at chunk boundaries under the frame limit, payloads 4-byte aligned', () => {
    const max = 64 + HEADER_BYTES + 3; // payload room 67 -> 64 bytes per chunk
    for (const n of [0, 1, 63, 64, 65, 128, 129, 1000]) {
      const p = payloadOf(n);
      const list = [...frames(p, base, max)];
      expect(list.length).toBe(Math.max(1, Math.ceil(n / 64)));
      for (const f of list) {
        expect(f.length).toBeLessThanOrEqual(max);
        expect(readHeader(f).offset % 4).toBe(0);
      }
      expect([...reassemble(list, n)]).toEqual([...p]);
    }
  });

  it('keeps full-size frames at or under 256 KiB', () => {
    const list = [...frames(new Uint8Array(1 << 20), base)];
    expect(list.every((f) => f.length <= 262_144)).toBe(true);
    expect(list.length).toBe(5);
  });

  it('an empty message is one header-only frame', () => {
    const list = [...frames(new Uint8Array(0), base)];
    expect(list).toHaveLength(1);
    expect(readHeader(list[0])).toMatchObject({ total: 0, offset: 0, length: 0 });
  });
});

describe('reassembly rejects bad chunks', () => {
  const list = [...frames(payloadOf(256), base, 64 + HEADER_BYTES)];
  const start = () => new Reassembler(256, () => {});

  it('a duplicate chunk', () => {
    const r = start();
    r.push(list[0]);
    r.push(list[1]);
    expect(() => r.push(list[1])).toThrow(FramingError);
    expect(() => start().push(list[0])).not.toThrow();
    const r2 = start();
    r2.push(list[0]);
    expect(() => r2.push(list[0])).toThrow(errorOf(FramingError, /duplicate chunk at offset 0; expected offset 64/));
  });

  it('an empty chunk of a non-empty message (it would pass for progress and keep a receive waiting)', () => {
    const r = start();
    r.push(list[0]);
    const empty = new Uint8Array(HEADER_BYTES);
    writeHeader(empty, { ...readHeader(list[1]), length: 0 });
    expect(() => r.push(empty)).toThrow(errorOf(FramingError, /empty chunk at offset 64 of a 256-byte message/));
  });

  it('an out-of-order chunk', () => {
    const r = start();
    r.push(list[0]);
    expect(() => r.push(list[2])).toThrow(errorOf(FramingError, /out-of-order chunk at offset 128; expected offset 64/));
  });

  it('a truncated chunk', () => {
    expect(() => readHeader(list[1].subarray(0, list[1].length - 5))).toThrow(
      errorOf(FramingError, /truncated chunk: header says 64 payload bytes, frame carries 59/),
    );
    expect(() => readHeader(new Uint8Array(10))).toThrow(errorOf(FramingError, /shorter than the 36-byte header/));
  });

  it('a chunk after the message is complete, or disagreeing on the total', () => {
    const r = start();
    for (const f of list) r.push(f);
    expect(() => r.push(list[3])).toThrow(errorOf(FramingError, /after the message was complete/));
    const other = [...frames(payloadOf(512), base, 64 + HEADER_BYTES)];
    expect(() => start().push(other[0])).toThrow(errorOf(FramingError, /message has 512 bytes, earlier chunks said 256/));
  });

  it('a foreign frame', () => {
    const f = list[0].slice();
    f[0] = 0x42;
    expect(() => readHeader(f)).toThrow(errorOf(FramingError, /magic 0x42/));
  });
});

describe('abort notices about the sender itself', () => {
  const roundTrip = (err: Error, origin: number) => {
    const frame = encodeAbortNotice(3, err, origin);
    return decodeAbortNotice(origin, readHeader(frame), frame);
  };

  it('a rank that found it was paused is a lost rank to its peers, in its own words', () => {
    const got = roundTrip(new RankStalledError(1, 23_456, 'waiting for allReduce(sum) of 10 elements #42'), 1) as PeerLostError;
    expect(got).toBeInstanceOf(PeerLostError);
    expect(got.rank).toBe(1);
    expect(got.message).toBe(
      'lost rank 1: stalled: its page was paused for 23456 ms while it was waiting for allReduce(sum) of 10 elements #42',
    );
  });

  it('carry the group whose collective failed (0, the top-level group, unless told)', () => {
    expect(readHeader(encodeAbortNotice(3, new Error('x'), 0)).group).toBe(0);
    expect(readHeader(encodeAbortNotice(3, new Error('x'), 0, 2))).toMatchObject({ kind: FrameKind.abort, group: 2, seq: 3 });
  });

  it('a rank leaving speaks for itself; a lost rank reported by another says by whom', () => {
    expect(roundTrip(new PeerLostError(2, 'its tab closed'), 2).message).toBe('lost rank 2: its tab closed');
    expect(roundTrip(new PeerLostError(2, 'its tab closed'), 0).message).toBe('lost rank 2: reported by rank 0: its tab closed');
  });

  it("a notice in another rank's name says who passed it on: a member cannot speak for an honest rank unnoticed", () => {
    // Rank 3 sends a notice claiming rank 2 announced its own leaving.
    const forged = encodeAbortNotice(3, new PeerLostError(2, 'its tab closed'), 2);
    expect(decodeAbortNotice(3, readHeader(forged), forged).message).toBe(
      'lost rank 2: reported by rank 2 (passed on by rank 3): its tab closed',
    );
    const aborted = encodeAbortNotice(3, new Error('boom'), 1);
    expect(decodeAbortNotice(0, readHeader(aborted), aborted).message).toContain('(passed on by rank 0)');
  });
});
