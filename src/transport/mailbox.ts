/**
 * The message mailbox of a process group: matches incoming frames to the receives waiting for
 * them, by (sender, kind, sequence number, step), reassembling chunked messages. Frames that
 * arrive before their receive is posted are kept until it is. A receive whose sender goes
 * silent for `peerTimeoutMs` reports the sender as lost. Abort notices (one rank telling the
 * others a collective failed) are encoded and decoded here too. No I/O: the process group feeds
 * it frames.
 *
 * Every frame is untrusted: what a peer can make this rank keep is bounded. Frames are buffered
 * only for sequence numbers at most `maxSeqAhead` past the last one this rank issued, for message
 * numbers a collective can have, and up to `maxBufferedBytes` per peer; anything else is a
 * FramingError (the group then fails, as for any bad frame) instead of memory held forever.
 *
 * Each process group has its own mailbox (a subgroup's too); peers are named by their ranks in
 * the top-level group, the links' numbering, so that errors name them as the user knows them.
 */
import {
  CollectiveAbortedError,
  CollectiveMismatchError,
  ConnectionClosedError,
  DistTimeoutError,
  FramingError,
  GroupClosedError,
  PeerLostError,
  RankStalledError,
} from '../wire/errors.ts';
import {
  Collective,
  FrameKind,
  HEADER_BYTES,
  Reassembler,
  describeCollective,
  sameDescriptor,
  writeHeader,
  type Descriptor,
  type FrameHeader,
} from '../wire/framing.ts';

export type OnChunk = (payload: Uint8Array, offset: number, frame: Uint8Array) => void;

interface Receiver {
  peer: number;
  key: string;
  kind: FrameKind;
  seq: number;
  descriptor: Descriptor;
  expectedBytes: number;
  reassembler: Reassembler | undefined;
  onChunk: OnChunk;
  resolve(): void;
  reject(err: Error): void;
  timer: ReturnType<typeof setTimeout> | undefined;
  /** The message as a whole (see MESSAGE_MIN_RATE): a peer that drips chunks cannot hold a receive for ever. */
  deadline: ReturnType<typeof setTimeout> | undefined;
  what: string;
}

/**
 * The slowest a message may arrive, in bytes per ms (16 KiB/s, a poor mobile link): a receive
 * fails once it has waited `peerTimeoutMs` plus its bytes at this rate, however its chunks trickle.
 */
const MESSAGE_MIN_RATE = 16;

interface InboxEntry {
  buffered: Array<{ frame: Uint8Array; header: FrameHeader }>;
  receiver?: Receiver;
}

/** What one peer may make this rank hold. */
export interface MailboxLimits {
  /** How far past the last sequence number this rank issued (per kind, and per peer for p2p) a frame may be. */
  maxSeqAhead: number;
  /** Message numbers within one collective are below this. */
  maxStep: number;
  /** Bytes of frames from one peer waiting for receives not posted yet. */
  maxBufferedBytes: number;
}

/** Defaults: more collectives than DDP keeps in flight (one per bucket), a quarter GiB per peer. */
export const DEFAULT_MAX_SEQ_AHEAD = 64;
export const DEFAULT_MAX_BUFFERED_BYTES = 256 << 20;

/** Messages completed recently, to catch a sender that sends one twice. */
const COMPLETED_KEPT = 4096;

export class Mailbox {
  private readonly inbox = new Map<string, InboxEntry>();
  private readonly completed = new Set<string>();
  private readonly receivers = new Set<Receiver>();
  /** Bytes this mailbox buffers per peer (its part of `allHeld`). */
  private readonly held = new Map<number, number>();
  /** When each peer was last heard from (any frame, its link opening); unset until its link opens. */
  private readonly lastHeard = new Map<number, number>();

  constructor(
    private readonly rank: number,
    private readonly peerTimeoutMs: number,
    /** A sender stayed silent past the timeout while a receive waited on it. */
    private readonly onSilentPeer: (peer: number, reason: string) => void,
    private readonly limits: MailboxLimits,
    /** The last sequence number this rank issued of `kind` (for p2p: the last receive posted for `peer`). */
    private readonly issued: (peer: number, kind: FrameKind) => number,
    /** Appended to what a receive waits for, in errors: which subgroup it is in (" in subgroup 1 [1, 3]"); empty for the top-level group. */
    private readonly label = '',
    /**
     * Bytes buffered per peer by every group of this rank, for `limits.maxBufferedBytes`: the
     * bound is one per peer, however many groups (a pipeline mesh's) the peer shares with it.
     */
    private readonly allHeld: Map<number, number> = new Map(),
    /** The clock silences are judged on: wall time, or the time this page ran (TickGap.running). */
    private readonly clock: () => number = Date.now,
  ) {}

  /**
   * Waits for message (kind, seq, step) from `peer`, which must match `descriptor` and be
   * `expectedBytes` long; calls `onChunk` for each chunk in order. Rejects if `ready` rejects
   * (the link to the peer failed to open).
   */
  receive(
    peer: number,
    kind: FrameKind,
    seq: number,
    step: number,
    descriptor: Descriptor,
    expectedBytes: number,
    onChunk: OnChunk,
    ready: Promise<unknown>,
  ): Promise<void> {
    const key = inboxKey(peer, kind, seq, step);
    return new Promise<void>((resolve, reject) => {
      const receiver: Receiver = {
        peer,
        key,
        kind,
        seq,
        descriptor,
        expectedBytes,
        reassembler: undefined,
        onChunk,
        timer: undefined,
        deadline: undefined,
        what: `${describeCollective(descriptor)} #${seq} step ${step}${this.label}`,
        resolve: () => {
          this.finish(receiver);
          resolve();
        },
        reject: (err) => {
          this.finish(receiver);
          reject(err);
        },
      };
      ready.catch((err: Error) => receiver.reject(err));
      this.receivers.add(receiver);
      let entry = this.inbox.get(key);
      if (!entry) {
        entry = { buffered: [] };
        this.inbox.set(key, entry);
      }
      entry.receiver = receiver;
      this.armTimer(receiver);
      const limitMs = this.peerTimeoutMs + Math.ceil(expectedBytes / MESSAGE_MIN_RATE);
      receiver.deadline = setTimeout(() => {
        this.onSilentPeer(peer, `did not finish sending ${receiver.what} (${expectedBytes} bytes) within ${limitMs} ms`);
      }, limitMs);
      for (const { frame, header } of entry.buffered.splice(0)) {
        this.hold(peer, -frame.length);
        this.deliver(receiver, frame, header);
        if (!this.receivers.has(receiver)) return;
      }
      if (kind === FrameKind.collective) {
        const other = this.bufferedOf(seq).find((h) => !sameDescriptor(h, descriptor));
        if (other) receiver.reject(this.mismatch(other, seq, descriptor));
      }
    });
  }

  /** Headers of the frames buffered for collective `seq`, any peer and step. */
  private bufferedOf(seq: number): FrameHeader[] {
    const out: FrameHeader[] = [];
    for (const entry of this.inbox.values()) {
      for (const { header } of entry.buffered) if (header.kind === FrameKind.collective && header.seq === seq) out.push(header);
    }
    return out;
  }

  private mismatch(h: Descriptor, seq: number, mine: Descriptor, from?: number): CollectiveMismatchError {
    const who = from === undefined ? 'a rank' : `rank ${from}`;
    return new CollectiveMismatchError(
      `collective #${seq}${this.label} does not match: ${who} issued ${describeCollective(h)}, rank ${this.rank} issued ${describeCollective(mine)}`,
      seq,
    );
  }

  /** Any sign of life from `peer`: a frame of any kind, or its link opening. */
  heard(peer: number, now = this.clock()): void {
    this.lastHeard.set(peer, now);
  }

  /**
   * Fails a receive whose peer has shown no sign of life for `stallMs` although its link is open:
   * its page is paused, frozen or gone. A peer that is alive but late (busy elsewhere) keeps
   * sending liveness frames and is only bounded by `peerTimeoutMs`.
   */
  checkStalls(stallMs: number, now = this.clock()): void {
    for (const r of [...this.receivers]) {
      const last = this.lastHeard.get(r.peer);
      if (last === undefined || now - last <= stallMs) continue;
      this.onSilentPeer(
        r.peer,
        `stalled: no sign of life for ${now - last} ms (its page is paused, frozen or gone) while this rank waited for ${r.what}`,
      );
      return; // the group is broken now: every receive has been rejected
    }
  }

  /**
   * A collective or point-to-point frame from `from`. Throws FramingError for a repeated message,
   * or for one this rank would have to keep beyond the limits.
   */
  put(from: number, frame: Uint8Array, h: FrameHeader): void {
    this.heard(from);
    const key = inboxKey(from, h.kind, h.seq, h.step);
    if (this.completed.has(key)) {
      throw new FramingError(
        `rank ${from} sent a chunk (offset ${h.offset}) for a message already complete (seq ${h.seq} step ${h.step})`,
        from,
        'seq',
      );
    }
    let entry = this.inbox.get(key);
    if (entry?.receiver) {
      this.deliver(entry.receiver, frame, h);
      return;
    }
    // Another message of a collective this rank waits in: a peer that ran another algorithm (or
    // another collective) sends at steps this rank never posts, so it is caught here, not at a match.
    if (h.kind === FrameKind.collective) {
      const waiting = [...this.receivers].find((r) => r.kind === FrameKind.collective && r.seq === h.seq);
      if (waiting && !sameDescriptor(h, waiting.descriptor)) {
        waiting.reject(this.mismatch(h, h.seq, waiting.descriptor, from));
        return;
      }
    }
    // Nobody waits for it yet: keep it only if an honest peer could have sent it by now.
    const issued = this.issued(from, h.kind);
    const what = h.kind === FrameKind.p2p ? 'point-to-point message' : 'collective';
    if (h.seq < 1 || h.seq > issued + this.limits.maxSeqAhead) {
      throw new FramingError(
        `${what} #${h.seq}${this.label} is outside the window of ${this.limits.maxSeqAhead} past #${issued}, the last this rank issued; refused, not buffered`,
        from,
        'seq',
      );
    }
    if (h.step >= this.limits.maxStep) {
      throw new FramingError(
        `message step ${h.step} of ${what} #${h.seq} is past the last a collective has (${this.limits.maxStep - 1})`,
        from,
        'step',
      );
    }
    const held = (this.allHeld.get(from) ?? 0) + frame.length;
    if (held > this.limits.maxBufferedBytes) {
      throw new FramingError(
        `${held} bytes would wait for receives this rank has not posted, over the limit of ${this.limits.maxBufferedBytes} (${what} #${h.seq})`,
        from,
        'buffered',
      );
    }
    this.hold(from, frame.length);
    if (!entry) {
      entry = { buffered: [] };
      this.inbox.set(key, entry);
    }
    entry.buffered.push({ frame, header: h });
  }

  /** Rejects every waiting receive with `err`, and gives back what it buffered to the rank's bound. */
  failAll(err: Error): void {
    for (const r of [...this.receivers]) r.reject(err);
    for (const [peer, bytes] of this.held) this.allHeld.set(peer, (this.allHeld.get(peer) ?? 0) - bytes);
    this.held.clear();
    this.inbox.clear();
  }

  private deliver(r: Receiver, frame: Uint8Array, h: FrameHeader): void {
    try {
      if (!r.reassembler) {
        if (!sameDescriptor(h, r.descriptor) || h.total !== r.expectedBytes) {
          throw new CollectiveMismatchError(
            `collective #${h.seq}${this.label} does not match: rank ${r.peer} issued ${describeCollective(h)}, rank ${this.rank} issued ${describeCollective(r.descriptor)}`,
            h.seq,
          );
        }
        r.reassembler = new Reassembler(h.total, r.onChunk);
      }
      r.reassembler.push(frame, h);
      if (r.reassembler.done) {
        this.completed.add(r.key);
        if (this.completed.size > COMPLETED_KEPT) this.completed.delete(this.completed.values().next().value!);
        r.resolve();
      } else {
        this.armTimer(r);
      }
    } catch (err) {
      r.reject(err as Error);
    }
  }

  private hold(peer: number, bytes: number): void {
    this.held.set(peer, (this.held.get(peer) ?? 0) + bytes);
    this.allHeld.set(peer, (this.allHeld.get(peer) ?? 0) + bytes);
  }

  private armTimer(r: Receiver): void {
    if (r.timer !== undefined) clearTimeout(r.timer);
    r.timer = setTimeout(() => {
      this.onSilentPeer(r.peer, `sent nothing for ${this.peerTimeoutMs} ms while this rank waited for ${r.what}`);
    }, this.peerTimeoutMs);
  }

  private finish(r: Receiver): void {
    if (r.timer !== undefined) clearTimeout(r.timer);
    if (r.deadline !== undefined) clearTimeout(r.deadline);
    this.receivers.delete(r);
    const entry = this.inbox.get(r.key);
    if (entry?.receiver === r) this.inbox.delete(r.key);
  }
}

function inboxKey(peer: number, kind: number, seq: number, step: number): string {
  return `${peer}:${kind}:${seq}:${step}`;
}

// ---------------------------------------------------------------------------------------------
// Abort notices: what one rank tells the others when a collective fails there, so none waits.

type AbortKind = 'peer-lost' | 'mismatch' | 'framing' | 'recoverable' | 'other';

interface AbortNotice {
  kind: AbortKind;
  message: string;
  origin: number;
  lostRank?: number;
}

const MAX_NOTICE_MESSAGE = 2_000;

/** A notice that collective `seq` of process group `group` (0: the top-level group) failed at `origin` (a top-level rank). */
export function encodeAbortNotice(seq: number, err: Error, origin: number, group = 0): Uint8Array {
  // A rank that finds it was paused is, to its peers, a lost rank: it says so itself.
  if (err instanceof RankStalledError) {
    err = new PeerLostError(err.rank, `stalled: its page was paused for ${err.stalledMs} ms while it was ${err.during}`);
  }
  const notice: AbortNotice = {
    kind:
      err instanceof PeerLostError
        ? 'peer-lost'
        : err instanceof CollectiveMismatchError
          ? 'mismatch'
          : err instanceof FramingError
            ? 'framing'
            : err instanceof GroupClosedError ||
                err instanceof ConnectionClosedError ||
                err instanceof DistTimeoutError ||
                err instanceof CollectiveAbortedError
              ? 'recoverable'
              : 'other',
    // A lost rank's notice carries the reason alone: the receiver says "lost rank N: " itself.
    message: (err instanceof PeerLostError ? err.reason : err.message).slice(0, MAX_NOTICE_MESSAGE),
    origin,
    lostRank: err instanceof PeerLostError ? err.rank : undefined,
  };
  const payload = new TextEncoder().encode(JSON.stringify(notice));
  const frame = new Uint8Array(HEADER_BYTES + payload.length);
  writeHeader(frame, {
    kind: FrameKind.abort,
    group,
    collective: Collective.allReduce,
    reduceOp: 0,
    seq,
    step: 0,
    numel: 0,
    root: 0,
    total: payload.length,
    offset: 0,
    length: payload.length,
  });
  frame.set(payload, HEADER_BYTES);
  return frame;
}

/** The error an abort notice from `from` stands for. The notice is untrusted: anything odd is "other". */
export function decodeAbortNotice(from: number, h: FrameHeader, frame: Uint8Array): Error {
  let n: Partial<AbortNotice> = {};
  try {
    const parsed: unknown = JSON.parse(new TextDecoder().decode(frame.subarray(HEADER_BYTES)));
    if (typeof parsed === 'object' && parsed !== null) n = parsed as Partial<AbortNotice>;
  } catch {
    // an unreadable notice still aborts the collective
  }
  const message = typeof n.message === 'string' ? n.message.slice(0, MAX_NOTICE_MESSAGE) : 'no reason given';
  const claimed = typeof n.origin === 'number' && Number.isInteger(n.origin) ? n.origin : from;
  // The notice's origin is the sender's word: a notice passed on by another rank says who passed
  // it, so that a member cannot speak in an honest rank's name unnoticed.
  const origin: number | string = claimed === from ? from : `${claimed} (passed on by rank ${from})`;
  switch (n.kind) {
    case 'peer-lost':
      if (typeof n.lostRank === 'number' && Number.isInteger(n.lostRank)) {
        // A rank that announces its own leaving (its tab closing) speaks for itself, on its own link only.
        return new PeerLostError(n.lostRank, n.lostRank === from && claimed === from ? message : `reported by rank ${origin}: ${message}`);
      }
      break;
    case 'mismatch':
      return new CollectiveMismatchError(`rank ${origin} reported: ${message}`, h.seq);
    case 'framing':
      return new FramingError(`rank ${origin} reported: ${message}`);
    case 'recoverable':
      return new CollectiveAbortedError(claimed, h.seq, claimed === from ? message : `${message} (passed on by rank ${from})`, true);
  }
  return new CollectiveAbortedError(claimed, h.seq, claimed === from ? message : `${message} (passed on by rank ${from})`, false);
}
