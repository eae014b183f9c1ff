/**
 * Whole messages of any length between any two ranks of a round, over the top-level group's
 * links: what an RPC agent (src/rpc/) needs and the collectives do not give, since a collective's
 * receiver knows the length and posts the receive first, while an RPC callee learns of a call
 * when it arrives. Each message is cut into `rpc` frames numbered per peer and direction (`seq`);
 * a peer's frames arrive in order (the link is ordered, and sends to one peer go one message at a
 * time), so one reassembly per peer is enough, and a message is bounded by `maxMessageBytes`
 * before any of it is held.
 */
import { FramingError } from '../wire/errors.ts';
import { FrameKind, Reassembler, frames, type FrameHeader } from '../wire/framing.ts';
import type { MessageSink, SharedLinks } from '../transport/shared_links.ts';

/** The largest message by default: a 1 GiB model's gradients go by collectives, not RPC. */
export const DEFAULT_MAX_MESSAGE_BYTES = 64 << 20;

export interface MessageChannelOptions {
  /** A message longer than this is refused: the sender's send rejects, a peer's first frame fails the group. */
  maxMessageBytes?: number;
  /** The frame size sends are cut into (the group's `maxFrameBytes`). */
  maxFrameBytes: number;
}

type MessageHandler = (from: number, bytes: Uint8Array) => void;

interface Incoming {
  seq: number;
  bytes: Uint8Array;
  reassembler: Reassembler;
}

export class MessageChannel implements MessageSink {
  readonly maxMessageBytes: number;
  private readonly maxFrameBytes: number;
  private readonly sentSeq = new Map<number, number>();
  private readonly receivedSeq = new Map<number, number>();
  private readonly incoming = new Map<number, Incoming>();
  /** Each peer's sends, one message after another: a message's frames are never interleaved with another's. */
  private readonly sending = new Map<number, Promise<void>>();
  private readonly handlers = new Set<MessageHandler>();
  private readonly breakHandlers = new Set<(err: Error) => void>();
  private broken: Error | undefined;

  constructor(
    private readonly shared: SharedLinks,
    options: MessageChannelOptions,
  ) {
    this.maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.maxFrameBytes = options.maxFrameBytes;
    if (!(Number.isInteger(this.maxMessageBytes) && this.maxMessageBytes > 0))
      throw new RangeError(`maxMessageBytes must be a positive integer, got ${this.maxMessageBytes}`);
    shared.attachMessages(this);
  }

  /** This rank (top-level). */
  get rank(): number {
    return this.shared.rank;
  }

  /** Why nothing more can be sent or received, if so. */
  get error(): Error | undefined {
    return this.broken;
  }

  onMessage(handler: MessageHandler): () => void {
    this.handlers.add(handler);
    return () => this.handlers.delete(handler);
  }

  /** Called once when the rank's groups fail (a lost peer, the server gone, destroy). */
  onBroken(handler: (err: Error) => void): () => void {
    if (this.broken) queueMicrotask(() => handler(this.broken!));
    this.breakHandlers.add(handler);
    return () => this.breakHandlers.delete(handler);
  }

  /** Sends one message to top-level rank `peer`; resolves once its last frame is queued on the link. */
  send(peer: number, bytes: Uint8Array): Promise<void> {
    if (this.broken) return Promise.reject(this.broken);
    if (peer === this.rank) return Promise.reject(new RangeError(`rank ${peer} is this rank: a message channel joins two ranks`));
    if (bytes.length > this.maxMessageBytes)
      return Promise.reject(
        new RangeError(
          `a message of ${bytes.length} bytes to rank ${peer} is over the ${this.maxMessageBytes}-byte bound (maxMessageBytes)`,
        ),
      );
    const seq = (this.sentSeq.get(peer) ?? 0) + 1;
    this.sentSeq.set(peer, seq);
    const previous = this.sending.get(peer) ?? Promise.resolve();
    const sent = previous.catch(() => {}).then(() => this.sendFrames(peer, seq, bytes));
    this.sending.set(peer, sent);
    return sent;
  }

  private async sendFrames(peer: number, seq: number, bytes: Uint8Array): Promise<void> {
    const header = {
      kind: FrameKind.rpc,
      group: 0,
      collective: 0 as FrameHeader['collective'],
      reduceOp: 0,
      seq,
      step: 0,
      numel: 0,
      root: 0,
    };
    // Opens the link on first use, as a collective does (links are made lazily, within linkTimeoutMs).
    const link = await this.shared.links.get(peer);
    for (const frame of frames(bytes, header, this.maxFrameBytes)) {
      if (this.broken) throw this.broken;
      await link.send(frame);
    }
  }

  deliver(from: number, frame: Uint8Array, h: FrameHeader): void {
    if (this.broken) return;
    let msg = this.incoming.get(from);
    if (!msg) {
      const expected = (this.receivedSeq.get(from) ?? 0) + 1;
      if (h.seq !== expected) throw new FramingError(`RPC message ${h.seq} where message ${expected} was next`, from, 'seq');
      if (h.total > this.maxMessageBytes)
        throw new FramingError(`an RPC message of ${h.total} bytes is over this rank's ${this.maxMessageBytes}-byte bound`, from, 'length');
      const bytes = new Uint8Array(h.total);
      msg = { seq: h.seq, bytes, reassembler: new Reassembler(h.total, (payload, offset) => bytes.set(payload, offset)) };
      this.incoming.set(from, msg);
      this.receivedSeq.set(from, h.seq);
    } else if (h.seq !== msg.seq) {
      throw new FramingError(`RPC message ${h.seq} began before message ${msg.seq} ended`, from, 'seq');
    }
    msg.reassembler.push(frame, h);
    if (!msg.reassembler.done) return;
    this.incoming.delete(from);
    for (const handler of [...this.handlers]) handler(from, msg.bytes);
  }

  broke(err: Error): void {
    if (this.broken) return;
    this.broken = err;
    this.incoming.clear();
    for (const handler of [...this.breakHandlers]) handler(this.broken);
  }
}
