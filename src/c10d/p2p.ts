/**
 * Point-to-point messages (`ProcessGroup.send`/`recv`, torch's `dist.send`/`dist.recv`): their
 * own sequence numbers, one per peer and direction, apart from the collectives', so that a
 * receive takes the sender's messages in the order they were sent.
 */
import { Collective, type Descriptor } from '../wire/framing.ts';

/** A group's point-to-point sequence numbers, by peer (top-level rank). */
export class P2PSequences {
  private readonly sent = new Map<number, number>();
  private readonly received = new Map<number, number>();

  /** The number of the next send to `peer`. */
  nextSend(peer: number): number {
    return next(this.sent, peer);
  }

  /** The number of the next receive from `peer`. */
  nextRecv(peer: number): number {
    return next(this.received, peer);
  }

  /** The last receive from `peer` posted so far (0 before the first): the mailbox's window starts there. */
  lastRecv(peer: number): number {
    return this.received.get(peer) ?? 0;
  }
}

/** The descriptor every frame of a point-to-point message carries (both sides must agree on the length). */
export function p2pDescriptor(numel: number): Descriptor {
  return { collective: Collective.p2p, reduceOp: 0, numel, root: 0 };
}

function next(counters: Map<number, number>, peer: number): number {
  const n = (counters.get(peer) ?? 0) + 1;
  counters.set(peer, n);
  return n;
}
