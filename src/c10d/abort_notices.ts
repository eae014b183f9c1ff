/**
 * Abort notices: a collective that fails on one rank (a lost peer, a mismatch, a bad frame) is
 * announced to the group's other members, which fail it too and pass the notice on, so that no
 * rank waits forever for a collective a peer gave up on. One per group (a subgroup's notices
 * carry its id and reach its members only).
 */
import { FramingError, PeerLostError } from '../wire/errors.ts';
import type { FrameHeader } from '../wire/framing.ts';
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

export class AbortNotices {
  /** Collectives that failed, here or on a peer, and why. */
  private readonly aborted = new Map<number, Error>();

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

  /** A notice from member `from` (a top-level rank). Throws FramingError for one outside the window. */
  receive(from: number, frame: Uint8Array, h: FrameHeader): void {
    if (this.aborted.has(h.seq)) return;
    const { maxSeqAhead, label } = this.host;
    const last = this.host.lastSeq();
    // Only collectives this rank issued, or a peer could have issued ahead of it, can be
    // aborted: the window bounds the notices kept and forwarded.
    if (h.seq < 1 || h.seq > last + maxSeqAhead) {
      throw new FramingError(
        `abort notice for collective #${h.seq}${label} is outside the window of ${maxSeqAhead} past #${last}, the last this rank issued`,
        from,
        'seq',
      );
    }
    const err = decodeAbortNotice(from, h, frame);
    // Forward, so ranks that are not neighbours of the origin hear of it too.
    this.send(h.seq, err);
    // A lost rank told by a peer (or by itself, leaving) is a lost rank here too.
    if (err instanceof PeerLostError) this.host.markLost(err.rank, err.reason);
    else this.host.fail(err);
  }
}
