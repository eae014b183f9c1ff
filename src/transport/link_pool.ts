/**
 * Peer links kept across an elastic run's rounds. Each round's process group opens its links
 * through the pool (`factoryFor(round)`), which hands it a view of an open link to the same tab
 * when it has one, and opens one otherwise. Tabs are named by their member id, which a tab keeps
 * from round to round (ranks do not), so a regroup after a kill or a join opens only the links
 * that the new round's collectives need and no earlier round had: a handful, where opening every
 * link again (WebRTC's ICE, DTLS and SCTP handshakes, each under load) cost a 32-tab group most
 * of a regroup.
 *
 * The views of one physical link are told apart by round: before its first message of a round,
 * a side sends a marker [ROUND_MAGIC, round]; what follows belongs to that round. The receiver
 * hands it to the view of that round, keeps it (bounded) while this tab has not reached the round
 * yet, and drops what belongs to a round already over. A side switches rounds only after its
 * sends of the round before have left, so the channel's order is the rounds' order.
 *
 * A physical link is closed when its tab is not in the latest round, when it had not opened by
 * the next round (its signals may have gone to a rank that moved), when the peer breaks the
 * marker rules, and when the pool is closed (the connection to the server changed, the run ended,
 * or a round failed with every member still there: its links may be what broke).
 */
import { PeerLostError } from '../wire/errors.ts';
import type { LinkFactoryOptions, LinkState, PathSample, PeerLink, PeerLinkFactory, PendingLink } from './peer_link.ts';
import type { SignalEvent, SignalPayload } from '../wire/protocol.ts';

/** A round marker's first byte: neither a frame's (0xd7) nor a credit's (0xc3). */
export const ROUND_MAGIC = 0xa5;
const MARKER_BYTES = 5;
/** Most bytes a peer may send for rounds this tab has not reached yet (beyond it, the link is closed). */
export const MAX_AHEAD_BYTES = 8 * 1024 * 1024;

export function encodeRoundMarker(round: number): Uint8Array {
  const m = new Uint8Array(MARKER_BYTES);
  m[0] = ROUND_MAGIC;
  new DataView(m.buffer).setUint32(1, round, true);
  return m;
}

/** The round a marker names, or undefined when `bytes` is not a marker. */
export function readRoundMarker(bytes: Uint8Array): number | undefined {
  if (bytes.length !== MARKER_BYTES || bytes[0] !== ROUND_MAGIC) return undefined;
  return new DataView(bytes.buffer, bytes.byteOffset, MARKER_BYTES).getUint32(1, true);
}

export interface LinkPoolOptions {
  /** This tab's member id (the server's: its entry in a round's `members`). */
  self: number;
  /** Names this server instance's links apart from another's (member ids start again after a restart). */
  instance: string;
  /** Opens the physical links. */
  base: PeerLinkFactory;
  /** Sends a signaling payload to the member with `rank` in the server's latest round. */
  sendSignal(rank: number, data: SignalPayload): Promise<void>;
  /** The physical links' settings (a round's group asks for the same). */
  link: Pick<LinkFactoryOptions, 'iceServers' | 'highWaterMark' | 'windowBytes' | 'stallTimeoutMs'>;
}

export class LinkPool {
  private readonly carriers = new Map<number, Carrier>();
  /** Each member's rank in the latest round this tab knows of (or that a signal of it came from). */
  private readonly rankOf = new Map<number, number>();
  private round = -1;
  private members: number[] = [];
  private closed = false;

  constructor(private readonly o: LinkPoolOptions) {}

  get self(): number {
    return this.o.self;
  }

  /** The latest round and its members by rank: links to tabs not in it close; links not yet open start again. */
  enterRound(round: number, members: readonly number[]): void {
    this.round = round;
    this.members = [...members];
    members.forEach((m, rank) => {
      this.rankOf.set(m, rank);
    });
    const keep = new Set(members);
    for (const [member, c] of this.carriers) {
      if (!keep.has(member)) c.close(`member ${member} is not in round ${round}`);
      // Its signals may have gone to a rank that moved: the new round opens it afresh.
      else if (c.pending.link.state !== 'open' && c.attempt < round) c.close(`it had not opened by round ${round}`);
      else c.dropBefore(round);
    }
  }

  /** The factory for round `round`'s group: views of this pool's links, by the round's ranks. */
  factoryFor(round: number): PeerLinkFactory {
    const members = this.members;
    return (options) => {
      const member = members[options.peer];
      if (member === undefined || round !== this.round) {
        throw new Error(
          `no member has rank ${options.peer} in round ${round} (the pool is at round ${this.round} with ${members.length} members)`,
        );
      }
      return new RoundLink(options.peer, round, () => this.carrierFor(member, round));
    };
  }

  /**
   * A signal relayed by the server: for a link of this pool, or not (then ignored: false). The
   * link it feeds is the one to its sender as the server attests it (`e.member`): a channel
   * naming another pair is dropped, so no member can answer for another or take over its link.
   */
  onSignal(e: SignalEvent): boolean {
    const parsed = this.parseChannel(e.data.channel);
    if (!parsed || this.closed) return parsed !== undefined;
    const { member, attempt } = parsed;
    if (member !== e.member) return true;
    // Both from the server: the sender's rank in its latest round (the round event may come later).
    this.rankOf.set(e.member, e.from);
    let c = this.carriers.get(member);
    if (c && c.channel === null) c.bind(e.data.channel, attempt);
    else if (c && c.channel !== e.data.channel) {
      // A stale signal (an earlier attempt), or one this side, the initiator, cannot take.
      if (c.initiator || attempt <= c.attempt) return true;
      // A new attempt from the initiator replaces whatever this side had: it closed its end.
      c.close('the peer opened the link again');
      c = undefined;
    }
    c ??= this.open(member, attempt, e.data.channel);
    c.pending.receiveSignal(e.data.body);
    return true;
  }

  /** Open links, for tests and summaries. */
  openMembers(): number[] {
    return [...this.carriers].filter(([, c]) => c.pending.link.state === 'open').map(([m]) => m);
  }

  closeAll(reason: string): void {
    for (const c of this.carriers.values()) c.close(reason);
  }

  /** Closes the links that are not open (failed, closed, or never opened): the next round opens them afresh. */
  closeBroken(reason: string): void {
    for (const c of [...this.carriers.values()]) if (c.pending.link.state !== 'open') c.close(reason);
  }

  close(reason: string): void {
    this.closed = true;
    this.closeAll(reason);
  }

  private carrierFor(member: number, round: number): Carrier {
    if (this.closed) throw new PeerLostError(-1, 'the link pool was closed');
    const c = this.carriers.get(member);
    if (c) return c;
    // The lower member id opens the link; the other side waits for its signals (onSignal).
    const initiator = this.o.self < member;
    return this.open(member, round, initiator ? this.channel(member, round) : null);
  }

  private open(member: number, attempt: number, channel: string | null): Carrier {
    const initiator = this.o.self < member;
    const c = new Carrier(member, attempt, channel, initiator, this, () => {
      if (this.carriers.get(member) === c) this.carriers.delete(member);
    });
    this.carriers.set(member, c);
    return c;
  }

  /** For its carriers: a physical link to `member`, signaled through the server to the member's latest rank. */
  makePhysical(member: number, initiator: boolean, channelOf: () => string | null): PendingLink {
    return this.o.base({
      peer: member,
      // The same at both ends whichever attempt (in-memory links pair by it); signals name the attempt.
      channel: this.pairName(member),
      initiator,
      ...this.o.link,
      sendSignal: (body) => {
        const rank = this.rankOf.get(member);
        const channel = channelOf();
        if (rank === undefined || channel === null) return;
        this.o.sendSignal(rank, { channel, body }).catch(() => {
          // The member moved or left: the round's link timeout or the next round deals with it.
        });
      },
    });
  }

  get currentRound(): number {
    return this.round;
  }

  private pairName(member: number): string {
    const [lo, hi] = this.o.self < member ? [this.o.self, member] : [member, this.o.self];
    return `link:${this.o.instance}:${lo}-${hi}`;
  }

  private channel(member: number, attempt: number): string {
    return `${this.pairName(member)}:${attempt}`;
  }

  /** The other member and the attempt of a pool channel that names this tab; undefined for other channels. */
  private parseChannel(channel: string): { member: number; attempt: number } | undefined {
    const m = /^link:([^:]*):(\d+)-(\d+):(\d+)$/.exec(channel);
    if (!m || m[1] !== this.o.instance) return undefined;
    const [lo, hi, attempt] = [Number(m[2]), Number(m[3]), Number(m[4])];
    if (lo === this.o.self && hi !== lo) return { member: hi, attempt };
    if (hi === this.o.self && hi !== lo) return { member: lo, attempt };
    return undefined;
  }
}

/** One physical link to a member, shared by the views of successive rounds. */
class Carrier {
  readonly pending: PendingLink;
  private readonly views = new Map<number, RoundLink>();
  /** The round this side's sends belong to now (-1: none yet). */
  private sendRound = -1;
  private switching: Promise<void> | null = null;
  private inflight = 0;
  private readonly settled: Array<() => void> = [];
  /** The round the peer's messages belong to now (its last marker). */
  private recvRound = -1;
  private ahead: Array<{ round: number; bytes: Uint8Array }> = [];
  private aheadBytes = 0;
  private closeReason: string | null = null;

  constructor(
    readonly member: number,
    /** The round in which the initiator opened it. */
    public attempt: number,
    /** The signaling channel (null on the waiting side until the initiator's first signal names it). */
    public channel: string | null,
    readonly initiator: boolean,
    private readonly pool: LinkPool,
    private readonly onClosed: () => void,
  ) {
    this.pending = pool.makePhysical(member, initiator, () => this.channel);
    const link = this.pending.link;
    link.onMessage((bytes) => this.receive(bytes));
    link.onClose((reason) => this.closedBy(reason));
  }

  bind(channel: string, attempt: number): void {
    this.channel = channel;
    this.attempt = attempt;
  }

  register(view: RoundLink): void {
    this.views.set(view.round, view);
    const mine = this.ahead.filter((a) => a.round === view.round);
    if (mine.length === 0) return;
    this.ahead = this.ahead.filter((a) => a.round > view.round);
    this.aheadBytes = this.ahead.reduce((s, a) => s + a.bytes.length, 0);
    for (const a of mine) view.deliver(a.bytes);
  }

  unregister(view: RoundLink): void {
    if (this.views.get(view.round) === view) this.views.delete(view.round);
  }

  dropBefore(round: number): void {
    this.ahead = this.ahead.filter((a) => a.round >= round);
    this.aheadBytes = this.ahead.reduce((s, a) => s + a.bytes.length, 0);
  }

  /** Sends `bytes` for `round`, after the marker when this side's sends were for an earlier round. */
  send(round: number, bytes: Uint8Array): Promise<void> {
    if (round < this.sendRound)
      return Promise.reject(new PeerLostError(-1, `round ${round} is over on this link (it carries round ${this.sendRound})`));
    // The common case: no switch; the physical send runs synchronously up to its first wait.
    if (round === this.sendRound && !this.switching) return this.counted(bytes);
    return this.switchTo(round).then(() => this.counted(bytes));
  }

  private async counted(bytes: Uint8Array): Promise<void> {
    this.inflight++;
    try {
      await this.pending.link.send(bytes);
    } finally {
      this.inflight--;
      if (this.inflight === 0) for (const s of this.settled.splice(0)) s();
    }
  }

  private switchTo(round: number): Promise<void> {
    if (this.switching && this.sendRound === round) return this.switching;
    this.sendRound = round;
    const previous = this.switching ?? Promise.resolve();
    this.switching = previous
      .then(async () => {
        // Sends of the round before must leave first: the channel's order is the rounds' order.
        if (this.inflight > 0) await new Promise<void>((r) => this.settled.push(r));
        if (this.sendRound === round) await this.pending.link.send(encodeRoundMarker(round));
      })
      .finally(() => {
        if (this.sendRound === round) this.switching = null;
      });
    return this.switching;
  }

  private receive(bytes: Uint8Array): void {
    const marker = readRoundMarker(bytes);
    if (marker !== undefined) {
      if (marker < this.recvRound) {
        this.close(`member ${this.member} went back from round ${this.recvRound} to ${marker}`);
        return;
      }
      this.recvRound = marker;
      return;
    }
    const view = this.views.get(this.recvRound);
    if (view) {
      view.deliver(bytes);
      return;
    }
    // A round not reached yet here, or whose group has not used this link yet: kept, within a bound.
    if (this.recvRound >= this.pool.currentRound) {
      this.aheadBytes += bytes.length;
      if (this.aheadBytes > MAX_AHEAD_BYTES) {
        this.close(`member ${this.member} sent over ${MAX_AHEAD_BYTES} bytes for round ${this.recvRound}, which this tab has not reached`);
        return;
      }
      this.ahead.push({ round: this.recvRound, bytes });
    }
    // A round already over here: dropped.
  }

  close(reason: string): void {
    this.closeReason ??= reason;
    this.pending.link.close();
    this.closedBy(reason);
  }

  private closedBy(reason: string): void {
    const why = this.closeReason ?? reason;
    this.onClosed();
    for (const view of [...this.views.values()]) view.carrierClosed(why);
    this.views.clear();
    this.ahead = [];
    this.aheadBytes = 0;
    for (const s of this.settled.splice(0)) s();
  }
}

/** A round's view of a pooled link: what the round's group sees as its PeerLink to `peer`. */
class RoundLink implements PeerLink, PendingLink {
  bytesSent = 0;
  bytesReceived = 0;
  readonly opened: Promise<void>;
  private carrier: Carrier | null = null;
  private closedReason: string | null = null;
  private readonly messageHandlers: Array<(bytes: Uint8Array) => void> = [];
  private readonly closeHandlers: Array<(reason: string) => void> = [];
  private readonly unheard: Uint8Array[] = [];

  constructor(
    readonly peer: number,
    readonly round: number,
    carrierOf: () => Carrier,
  ) {
    let carrier: Carrier;
    try {
      carrier = carrierOf();
    } catch (err) {
      this.closedReason = (err as Error).message;
      this.opened = Promise.reject(err as Error);
      this.opened.catch(() => {});
      return;
    }
    this.carrier = carrier;
    carrier.register(this);
    this.opened = carrier.pending.opened;
    this.opened.catch(() => {});
  }

  get link(): PeerLink {
    return this;
  }

  get state(): LinkState {
    if (this.closedReason !== null || !this.carrier) return 'closed';
    return this.carrier.pending.link.state;
  }

  /** The carrier's signals go through the pool, not through the round's group. */
  receiveSignal(): void {}

  async send(bytes: Uint8Array): Promise<void> {
    if (this.closedReason !== null || !this.carrier) throw new PeerLostError(this.peer, this.closedReason ?? 'link is closed');
    await this.carrier.send(this.round, bytes);
    this.bytesSent += bytes.byteLength;
  }

  deliver(bytes: Uint8Array): void {
    if (this.closedReason !== null) return;
    this.bytesReceived += bytes.byteLength;
    // Kept messages come as the view registers, before its group listens.
    if (this.messageHandlers.length === 0) this.unheard.push(bytes);
    for (const h of this.messageHandlers) h(bytes);
  }

  onMessage(handler: (bytes: Uint8Array) => void): void {
    this.messageHandlers.push(handler);
    for (const bytes of this.unheard.splice(0)) handler(bytes);
  }

  onClose(handler: (reason: string) => void): void {
    if (this.closedReason !== null) handler(this.closedReason);
    else this.closeHandlers.push(handler);
  }

  path(): Promise<PathSample | undefined> {
    const link = this.carrier?.pending.link;
    return link?.path && this.state === 'open' ? link.path() : Promise.resolve(undefined);
  }

  /** The round is over here: the view goes, the physical link stays for the next round. */
  close(): void {
    this.carrier?.unregister(this);
    this.markClosed('closed locally');
  }

  carrierClosed(reason: string): void {
    this.markClosed(reason);
  }

  private markClosed(reason: string): void {
    if (this.closedReason !== null) return;
    this.closedReason = reason;
    for (const h of this.closeHandlers) h(reason);
  }
}
