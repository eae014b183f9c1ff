/**
 * Tensor frames: how a message of bytes travels over a peer link in chunks under the data
 * channel's 256 KiB message limit, and how the receiver reassembles it. Pure: no I/O.
 *
 * Every chunk carries a 36-byte little-endian header:
 *
 *   0  u8  magic (0xD7)        4  u32 seq     (collective or point-to-point sequence number)
 *   1  u8  kind  (FrameKind)   8  u32 step    (which message within the collective)
 *   2  u8  collective          12 u32 numel   (the collective's element count, for matching)
 *   3  u8  reduce op | dtype   16 u32 root    (broadcast source; 0 otherwise)
 *                              20 u32 total   (bytes in the whole message)
 *                              24 u32 offset  (where this chunk's payload starts)
 *                              28 u32 length  (payload bytes in this chunk)
 *                              32 u32 group   (0: the top-level group; 1, 2, ...: its subgroups)
 *
 * `group` says which process group of the rank the frame belongs to: subgroups (`newGroup`) run
 * over the top-level group's links, and each group numbers its collectives by itself. Liveness
 * frames are about the link, so they carry group 0.
 *
 * Byte 3 holds the reduce op in its low 4 bits and the payload's element type (the wire dtype,
 * half.ts: 0 float32, 1 float16, 2 bfloat16) in its high 4 bits.
 *
 * The descriptor fields (collective, reduce op, dtype, numel, root) let each receiver check that
 * the sender issued the same collective at the same sequence number; a mismatch (an all-reduce
 * with a float16 wire on one rank and float32 on another, say) is an error on both sides instead
 * of a hang or wrong numbers. Collective and point-to-point payloads are whole elements of their
 * dtype: their chunks start and end on 4-byte boundaries for float32, 2-byte ones for the 16-bit
 * dtypes (`checkChunk`).
 */
import { FramingError } from './errors.ts';
import { WIRE_DTYPE_NAMES, wireBytes } from './half.ts';

export const MAGIC = 0xd7;
export const HEADER_BYTES = 36;
/** The data channel's largest message (Chromium). */
export const MAX_FRAME_BYTES = 262_144;
/** What a sender cuts messages into by default: a quarter of the default credit window (peer_link.ts), so that a window holds several frames. */
export const DEFAULT_FRAME_BYTES = 32_768;

/** `alive`: a header-only frame each rank sends each link every second, so that a silent peer is told apart from a busy one. */
/**
 * `bye`: a header-only frame a rank destroying its group sends each link after its last messages
 * (step 0), and the answer of a peer that received it (step 1): once answered, everything sent
 * before it has arrived (the link is ordered), and the links can close.
 */
/**
 * `rpc`: a message of the rank's RPC agent (src/rpc/), group 0: opaque bytes the agent decodes,
 * numbered per peer and direction in `seq` (c10d/message_channel.ts).
 */
export const FrameKind = { collective: 1, p2p: 2, abort: 3, alive: 4, bye: 5, rpc: 6 } as const;
export type FrameKind = (typeof FrameKind)[keyof typeof FrameKind];

/** The latency-optimal algorithms have codes of their own: ranks that chose differently mismatch. */
export const Collective = {
  allReduce: 1,
  broadcast: 2,
  allGather: 3,
  reduceScatter: 4,
  meshAllReduce: 5,
  p2p: 6,
  allReduceDoubling: 7,
  allGatherBruck: 8,
  broadcastTree: 9,
  allReduceTree: 10,
  meshAllGather: 11,
} as const;
export type Collective = (typeof Collective)[keyof typeof Collective];
export const COLLECTIVE_NAMES: Record<number, string> = Object.fromEntries(Object.entries(Collective).map(([name, code]) => [code, name]));

export const ReduceOp = { sum: 0, avg: 1, max: 2, min: 3 } as const;
export type ReduceOpName = keyof typeof ReduceOp;
export const REDUCE_OP_NAMES: Record<number, ReduceOpName> = { 0: 'sum', 1: 'avg', 2: 'max', 3: 'min' };

/** What both sides of a collective must agree on. */
export interface Descriptor {
  collective: Collective;
  reduceOp: number;
  numel: number;
  root: number;
  /** The payload's element type on the wire (`WIRE_DTYPE_CODES`): 0 (float32) when left out. */
  dtype?: number;
}

export interface FrameHeader extends Descriptor {
  kind: FrameKind;
  /** The process group: 0 for the top-level group, its subgroups' ids otherwise. */
  group: number;
  seq: number;
  step: number;
  total: number;
  offset: number;
  length: number;
}

/** The latency-optimal algorithms' collectives, as a user calls them, and how they ran. */
const ALGORITHM_OF: Record<number, [string, string]> = {
  [Collective.allReduceDoubling]: ['allReduce', ' by recursive doubling'],
  [Collective.allReduceTree]: ['allReduce', ' up and down a binomial tree'],
  [Collective.allGatherBruck]: ['allGather', " by Bruck's algorithm"],
  [Collective.broadcastTree]: ['broadcast', ' down a binomial tree'],
};

export function describeCollective(d: Descriptor): string {
  const [called, how] = ALGORITHM_OF[d.collective] ?? [COLLECTIVE_NAMES[d.collective] ?? `collective#${d.collective}`, ''];
  const name = called;
  const op =
    d.collective === Collective.allReduce ||
    d.collective === Collective.reduceScatter ||
    d.collective === Collective.meshAllReduce ||
    d.collective === Collective.allReduceDoubling ||
    d.collective === Collective.allReduceTree
      ? `(${REDUCE_OP_NAMES[d.reduceOp] ?? d.reduceOp})`
      : d.collective === Collective.broadcast || d.collective === Collective.broadcastTree
        ? `(src ${d.root})`
        : '';
  const dtype = d.dtype ? ` with a ${WIRE_DTYPE_NAMES[d.dtype] ?? `dtype#${d.dtype}`} wire` : '';
  return `${name}${op} of ${d.numel} elements${dtype}${how}`;
}

export function sameDescriptor(a: Descriptor, b: Descriptor): boolean {
  return (
    a.collective === b.collective &&
    a.reduceOp === b.reduceOp &&
    a.numel === b.numel &&
    a.root === b.root &&
    (a.dtype ?? 0) === (b.dtype ?? 0)
  );
}

/** Bytes per element of a payload of wire dtype `code`. */
export function elementBytes(code = 0): number {
  return wireBytes(WIRE_DTYPE_NAMES[code] ?? 'float32');
}

export function writeHeader(frame: Uint8Array, h: FrameHeader): void {
  const v = new DataView(frame.buffer, frame.byteOffset, HEADER_BYTES);
  v.setUint8(0, MAGIC);
  v.setUint8(1, h.kind);
  v.setUint8(2, h.collective);
  if (h.reduceOp < 0 || h.reduceOp > 0x0f) throw new RangeError(`reduce op ${h.reduceOp} does not fit 4 bits`);
  const dtype = h.dtype ?? 0;
  if (dtype < 0 || dtype > 0x0f) throw new RangeError(`dtype ${dtype} does not fit 4 bits`);
  v.setUint8(3, h.reduceOp | (dtype << 4));
  v.setUint32(4, h.seq, true);
  v.setUint32(8, h.step, true);
  v.setUint32(12, h.numel, true);
  v.setUint32(16, h.root, true);
  v.setUint32(20, h.total, true);
  v.setUint32(24, h.offset, true);
  v.setUint32(28, h.length, true);
  v.setUint32(32, h.group, true);
}

/** Reads and checks a frame's header; throws FramingError on a short or foreign frame. */
export function readHeader(frame: Uint8Array): FrameHeader {
  if (frame.length < HEADER_BYTES) {
    throw new FramingError(`frame of ${frame.length} bytes is shorter than the ${HEADER_BYTES}-byte header`);
  }
  const v = new DataView(frame.buffer, frame.byteOffset, HEADER_BYTES);
  if (v.getUint8(0) !== MAGIC) throw new FramingError(`frame has magic 0x${v.getUint8(0).toString(16)}, expected 0xd7`);
  const kind = v.getUint8(1);
  if (
    kind !== FrameKind.collective &&
    kind !== FrameKind.p2p &&
    kind !== FrameKind.abort &&
    kind !== FrameKind.alive &&
    kind !== FrameKind.bye &&
    kind !== FrameKind.rpc
  ) {
    throw new FramingError(`frame has unknown kind ${kind}`);
  }
  const h: FrameHeader = {
    kind,
    collective: v.getUint8(2) as Collective,
    reduceOp: v.getUint8(3) & 0x0f,
    dtype: v.getUint8(3) >>> 4,
    seq: v.getUint32(4, true),
    step: v.getUint32(8, true),
    numel: v.getUint32(12, true),
    root: v.getUint32(16, true),
    total: v.getUint32(20, true),
    offset: v.getUint32(24, true),
    length: v.getUint32(28, true),
    group: v.getUint32(32, true),
  };
  if (WIRE_DTYPE_NAMES[h.dtype!] === undefined) {
    throw new FramingError(`frame has unknown element type ${h.dtype} (seq ${h.seq})`, undefined, 'dtype');
  }
  if (frame.length - HEADER_BYTES !== h.length) {
    throw new FramingError(
      `truncated chunk: header says ${h.length} payload bytes, frame carries ${frame.length - HEADER_BYTES} (seq ${h.seq}, offset ${h.offset})`,
      undefined,
      'length',
    );
  }
  if (h.offset + h.length > h.total) {
    throw new FramingError(
      `chunk [${h.offset}, ${h.offset + h.length}) runs past the message's ${h.total} bytes (seq ${h.seq})`,
      undefined,
      'length',
    );
  }
  return h;
}

/**
 * Collective and point-to-point payloads are whole elements of the header's dtype: float32
 * unless a 16-bit wire was asked for (`frames` cuts them on 4-byte boundaries, so only a
 * 16-bit message's last chunk may end on a 2-byte one); int8 blocks are bytes. A chunk that does not start and end on
 * an element's boundary cannot be viewed as values. Throws FramingError naming the field. Abort
 * notices carry JSON and RPC messages bytes: neither is checked.
 */
export function checkChunk(h: FrameHeader): void {
  if (h.kind === FrameKind.abort || h.kind === FrameKind.rpc) return;
  if (h.kind === FrameKind.alive || h.kind === FrameKind.bye) {
    if (h.length !== 0 || h.total !== 0)
      throw new FramingError(
        `a ${h.kind === FrameKind.bye ? 'bye' : 'liveness'} frame carries no payload, this one ${h.length} bytes`,
        undefined,
        'length',
      );
    return;
  }
  const size = elementBytes(h.dtype);
  if (h.offset % size !== 0)
    throw new FramingError(`chunk offset ${h.offset} is not a multiple of ${size} bytes (seq ${h.seq})`, undefined, 'offset');
  if (h.length % size !== 0)
    throw new FramingError(`chunk length ${h.length} is not a multiple of ${size} bytes (seq ${h.seq})`, undefined, 'length');
}

/**
 * Splits a message into frames of at most `maxFrameBytes`, payloads aligned to 4 bytes so a
 * receiver can view them as Float32 (or 16-bit values). An empty message is one header-only frame, so that even a
 * zero-length collective is matched (and a mismatch noticed) on the other side.
 */
export function* frames(
  payload: Uint8Array,
  header: Omit<FrameHeader, 'total' | 'offset' | 'length'>,
  maxFrameBytes = MAX_FRAME_BYTES,
): Generator<Uint8Array> {
  const chunk = Math.floor((maxFrameBytes - HEADER_BYTES) / 4) * 4;
  if (chunk <= 0) throw new RangeError(`maxFrameBytes ${maxFrameBytes} leaves no room for payload`);
  let offset = 0;
  do {
    const length = Math.min(chunk, payload.length - offset);
    const frame = new Uint8Array(HEADER_BYTES + length);
    writeHeader(frame, { ...header, total: payload.length, offset, length });
    frame.set(payload.subarray(offset, offset + length), HEADER_BYTES);
    yield frame;
    offset += length;
  } while (offset < payload.length);
}

/**
 * Rebuilds one message from its chunks, which an ordered channel delivers in order: each chunk
 * must start where the last ended and agree on the total. Anything else (a duplicate, a gap, a
 * chunk after the end) is a FramingError.
 */
export class Reassembler {
  private received = 0;
  private started = false;

  constructor(
    readonly total: number,
    /** Called with each chunk's payload, where it belongs in the message, and the whole frame. */
    private readonly onChunk: (payload: Uint8Array, offset: number, frame: Uint8Array) => void,
  ) {}

  get done(): boolean {
    return this.started && this.received === this.total;
  }

  push(frame: Uint8Array, h: FrameHeader = readHeader(frame)): void {
    if (h.total !== this.total) {
      throw new FramingError(`chunk says the message has ${h.total} bytes, earlier chunks said ${this.total} (seq ${h.seq})`);
    }
    if (this.done) throw new FramingError(`chunk at offset ${h.offset} arrived after the message was complete (seq ${h.seq})`);
    if (h.offset < this.received) {
      throw new FramingError(`duplicate chunk at offset ${h.offset}; expected offset ${this.received} (seq ${h.seq})`);
    }
    if (h.offset > this.received) {
      throw new FramingError(`out-of-order chunk at offset ${h.offset}; expected offset ${this.received} (seq ${h.seq})`);
    }
    // An empty chunk of a non-empty message carries nothing but would count as a sign of progress:
    // a hostile peer could keep a receive waiting forever with them.
    if (h.length === 0 && this.total > 0)
      throw new FramingError(`empty chunk at offset ${h.offset} of a ${this.total}-byte message (seq ${h.seq})`);
    this.started = true;
    this.received += h.length;
    this.onChunk(frame.subarray(HEADER_BYTES), h.offset, frame);
  }
}

/** The liveness frame: a header and nothing else, about the link (group 0). */
/** A bye frame: `answer` false for the leaving rank's, true for the peer's answer. */
export function encodeBye(answer: boolean): Uint8Array {
  const frame = new Uint8Array(HEADER_BYTES);
  writeHeader(frame, {
    kind: FrameKind.bye,
    group: 0,
    collective: 0 as FrameHeader['collective'],
    reduceOp: 0,
    seq: 0,
    step: answer ? 1 : 0,
    numel: 0,
    root: 0,
    total: 0,
    offset: 0,
    length: 0,
  });
  return frame;
}

export function encodeAlive(): Uint8Array {
  const frame = new Uint8Array(HEADER_BYTES);
  writeHeader(frame, {
    kind: FrameKind.alive,
    group: 0,
    collective: 0 as FrameHeader['collective'],
    reduceOp: 0,
    seq: 0,
    step: 0,
    numel: 0,
    root: 0,
    total: 0,
    offset: 0,
    length: 0,
  });
  return frame;
}
