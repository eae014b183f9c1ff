/**
 * How one group's messages move (for `ProcessGroup`): the links every group of a rank shares
 * (made once, by the top-level group), the group's mailbox (frames to receives), and the
 * transport a collective or a send/recv hands the ring algorithms. The algorithms see this
 * group's ranks; the links and the mailbox see top-level ranks, so the translation lives here.
 */
import { FrameKind, frames, type Descriptor } from '../wire/framing.ts';
import { Mailbox } from '../transport/mailbox.ts';
import { SharedLinks, type ProcessGroupEvent, type RoutedGroup } from '../transport/shared_links.ts';
import type { AbortNotices } from './abort_notices.ts';
import type { GroupBreak } from './group_break.ts';
import type { GroupMembers } from './subgroups.ts';
import type { GroupInit, ResolvedLinkOptions } from './group_options.ts';
import type { RingTransport } from './ring.ts';

/** The links under every group of this rank: the top-level group makes them, its subgroups reuse them. */
export function topLevelLinks(init: GroupInit, options: ResolvedLinkOptions): SharedLinks {
  return new SharedLinks({
    client: init.client,
    rank: init.rank,
    round: init.round,
    groupKey: init.groupKey,
    linkFactory: init.linkFactory,
    iceServers: options.iceServers,
    highWaterMark: options.highWaterMark,
    windowBytes: options.linkWindowBytes,
    peerTimeoutMs: options.peerTimeoutMs,
    stallTimeoutMs: options.stallTimeoutMs,
    linkTimeoutMs: options.linkTimeoutMs,
    early: init.early,
    onStalled: init.onStalled,
  });
}

/** What a group's mailbox needs from its group. */
export interface MailboxOwner {
  shared: SharedLinks;
  worldSize: number;
  /** " in subgroup 1 [1, 3]", for messages; empty for the top-level group. */
  label: string;
  /** The last sequence number the group issued of `kind` (for p2p: the last receive posted for `peer`). */
  issued: (peer: number, kind: FrameKind) => number;
}

/** The group's mailbox: bounded by the options, and by the bytes every group of this rank holds per peer. */
export function groupMailbox(g: MailboxOwner, options: ResolvedLinkOptions): Mailbox {
  return new Mailbox(
    g.shared.rank,
    options.peerTimeoutMs,
    (peer, reason) => g.shared.markLost(peer, reason),
    {
      maxSeqAhead: options.maxSeqAhead,
      // An all-reduce numbers its messages 0 .. 2(n-1)-1; other collectives use 0 only.
      maxStep: Math.max(1, 2 * (g.worldSize - 1)),
      maxBufferedBytes: options.maxBufferedBytes,
    },
    g.issued,
    g.label,
    g.shared.heldBytes,
    () => g.shared.runningNow(),
  );
}

/** A group as its transports and the shared links' routing see it. */
export interface GroupWires {
  rank: number;
  worldSize: number;
  groupId: number;
  /** The members as top-level ranks (group rank i is top-level rank `members.ranks[i]`). */
  members: GroupMembers;
  shared: SharedLinks;
  mailbox: Mailbox;
  aborts: AbortNotices;
  breakage: GroupBreak;
  maxFrameBytes: number;
  listeners: ReadonlySet<(e: ProcessGroupEvent) => void>;
  /** Counts bytes handed to a link (the group's `bytesSent`). */
  sent(bytes: number): void;
  /** The last collective sequence number the group issued. */
  lastSeq(): number;
  /** Every pending receive rejects with `err`, and so does every later call. */
  breakWith(err: Error): void;
}

/** Messages of one collective (or one point-to-point transfer) numbered `seq`, for the ring algorithms. */
export function groupTransport(g: GroupWires, kind: FrameKind, seq: number, d: Descriptor): RingTransport & { seq: number } {
  const group = g.groupId;
  const ranks = g.members.ranks;
  const failFast = <T>(p: Promise<T>): Promise<T> => g.breakage.race(p);
  return {
    seq,
    rank: g.rank,
    worldSize: g.worldSize,
    send: async (peer, step, bytes) => {
      const link = await g.shared.links.get(ranks[peer]!);
      for (const frame of frames(bytes, { kind, group, seq, step, ...d }, g.maxFrameBytes)) {
        g.breakage.throwIfBroken();
        g.sent(frame.length);
        // A send waiting for the queue to drain stops as soon as the group breaks.
        await failFast(link.send(frame));
      }
    },
    // Make sure the link exists while waiting: the other side may be the one to open it.
    recv: (peer, step, bytes, onChunk) => {
      const from = ranks[peer]!;
      return g.mailbox.receive(from, kind, seq, step, d, bytes, onChunk, g.shared.links.get(from));
    },
    connect: async (peer) => {
      await failFast(g.shared.links.get(ranks[peer]!));
    },
    forward: async (peer) => {
      const link = await g.shared.links.get(ranks[peer]!);
      return (frame) => {
        g.sent(frame.length);
        return link.send(frame);
      };
    },
  };
}

/** The group as the shared links route to it: its frames, its peers' liveness, its failure. */
export function routedGroup(g: GroupWires): RoutedGroup {
  return {
    id: g.groupId,
    ranks: g.members.ranks,
    has: (rank) => g.members.has(rank),
    deliver: (from, frame, h) => {
      if (h.kind === FrameKind.abort) return g.aborts.receive(from, frame, h);
      // A broken group posts no more receives: data arriving now could only pile up.
      if (!g.breakage.error) g.mailbox.put(from, frame, h);
    },
    heard: (from) => g.mailbox.heard(from),
    checkStalls: (stallMs) => g.mailbox.checkStalls(stallMs),
    broke: (err) => g.breakWith(err),
    emit: (e) => {
      if (e.type === 'link' && !g.members.has(e.peer)) return;
      for (const l of g.listeners) l(e);
    },
    lastSeq: () => g.lastSeq(),
  };
}
