/**
 * Abort notices: a collective that fails on one rank (a lost peer, a mismatch, a bad frame) is
 * announced to the group's other members, which fail it too and pass the notice on, so that no
 * rank waits forever for a collective a peer gave up on. One per group (a subgroup's notices
 * carry its id and reach its members only).
 */
import { FramingError, PeerLostError } from '../errors.ts';
import type { FrameHeader } from './framing.ts';
import { decodeAbortNotice, encodeAbortNotice } from '../transport/mailbox.ts';
import type { PeerLink } from '../transport/peer_link.ts';

/** What the notices need of their process group. */
export interface AbortNoticeHost {
  /** This rank in the top-level group. */
  readonly rank: number;
  readonly groupId: number;
  /** " in subgroup 1 [1, 3]", for messages; empty for the top-level group. */
  readonly label: string;
  /** How far past `lastSeq()` a peer's notice may be (LinkOptions.maxSeqAhead). */
  readonly maxSeqAhead: number;
  /** The last collective sequence number this rank issued in the group. */
  lastSeq(): number;
  /** The open links to the group's other members. */
  links(): PeerLink[];
  /** Top-level rank `rank` is lost (fails every group of this rank). */
  markLost(rank: number, reason: string): void;
  /** Fails the group (and every group of this rank) with `err`. */
  fail(err: Error): void;
}

/** Answers remembered (the oldest forgotten first): a bound on what a chatty peer can make this rank keep. */
const MAX_ANSWERED = 1024;

export class AbortNotices {
  /** Collectives that failed, here or on a peer, and why. */
  private readonly aborted = new Map<number, Error>();
  /** (peer, collective) pairs told by `answer`, so a peer's every frame does not get a notice. */
  private readonly answered = new Set<string>();

  constructor(private readonly host: AbortNoticeHost) {}

  /** Why collective `seq` failed, if a notice (or this rank) already failed it. */
  reason(seq: number): Error | undefined {
    return this.aborted.get(seq);
  }

  /** Tells the group's other members that collective `seq` failed here (once per collective). */
  send(seq: number, err: Error): void {
    if (this.aborted.has(seq)) return;
    this.aborted.set(seq, err);
    const frame = encodeAbortNotice(seq, err, this.host.rank, this.host.groupId);
    for (const link of this.host.links()) link.send(frame).catch(() => {});
  }

  /**
   * Member `from` sent data for collective `seq`, which failed here: it had not heard (a rank
   * whose link opened after the notice went out, or a peer of another algorithm's pattern), so
   * it is told over that link, once, instead of waiting out its timeout for data that never comes.
   */
  answer(from: number, seq: number): void {
    const err = this.aborted.get(seq);
    const key = `${from}:${seq}`;
    if (!err || this.answered.has(key)) return;
    this.answered.add(key);
    if (this.answered.size > MAX_ANSWERED) this.answered.delete(this.answered.values().next().value!);
    const link = this.host.links().find((l) => l.peer === from);
    link?.send(encodeAbortNotice(seq, err, this.host.rank, this.host.groupId)).catch(() => {});
  }

  /** A notice from member `from` (a top-level rank). Throws FramingError for one outside the window. */
  receive(from: number, frame: Uint8Array, h: FrameHeader): void {
    if (this.aborted.has(h.seq)) return;
    const { maxSeqAhead, label } = this.host;
    const last = this.host.lastSeq();
    // Only collectives this rank issued, or a peer could have issued ahead of it, can be
    // aborted: the window bounds the notices kept and forwarded.
    if (h.seq < 1 || h.seq > last + maxSeqAhead) {
      throw new FramingError(`abort notice for collective #${h.seq}${label} is outside the window of ${maxSeqAhead} past #${last}, the last this rank issued`, from, 'seq');
    }
    const err = decodeAbortNotice(from, h, frame);
    // Forward, so ranks that are not neighbours of the origin hear of it too.
    this.send(h.seq, err);
    // A lost rank told by a peer (or by itself, leaving) is a lost rank here too.
    if (err instanceof PeerLostError) this.host.markLost(err.rank, err.reason);
    else this.host.fail(err);
  }
}
