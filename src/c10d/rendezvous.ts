/**
 * Rendezvous: how ranks find each other and get a process group.
 *
 * - `initProcessGroup` (torch's init_process_group, src/c10d/init_process_group.ts): join a
 *   group of a fixed world size and resolve once all of it is there.
 * - `RendezvousHandler` (torch elastic's rendezvous handler): join a group of min..max members
 *   and follow it through rounds; each round is a fixed set of ranks with its own ProcessGroup.
 *   A member lost or arriving makes a new round. It reports how many members wait for the next
 *   round (num nodes waiting) and, when asked to, rejoins after the server went away or evicted
 *   this member.
 *
 * Both are one code path: a fixed world size N is the range N..N. When the run ends, a rank
 * closes the rendezvous (`closeRendezvous`, torch's set_closed): a member still waiting for a
 * rank, or arriving later, then fails at once with RendezvousClosedError instead of waiting out
 * its timeout for a group that will never train again.
 */
import {
  DistTimeoutError,
  GroupClosedError,
  RemovedByHostError,
  RendezvousClosedError,
  SessionEndedError,
  UnauthorizedError,
} from '../wire/errors.ts';
import { onPageHide, onPageRestored } from '../runtime/page_lifecycle.ts';
import type { PeerLinkFactory } from '../transport/peer_link.ts';
import { loadSimplePeer, simplePeerLinkFactory } from '../transport/webrtc_link.ts';
import { LinkPool } from '../transport/link_pool.ts';
import { ProcessGroup } from './process_group.ts';
import { resolveLinkOptions, type ResolvedLinkOptions } from './group_options.ts';
import {
  CloseCode,
  DEFAULT_STORE_TIMEOUT_MS,
  rendezvousClosedMessage,
  rendezvousClosedOnRankMessage,
  type RoundEvent,
  type SignalEvent,
  type WaitingEvent,
} from '../wire/protocol.ts';
import { StoreClient } from './store.ts';
import { afterClose } from './close_meaning.ts';
import { isStoreUnavailable, type StoreAvailabilityEvent } from './store_unavailable.ts';

// The handler's contract (its options, its rounds, its events) is its own module; importable from here as before.
export type { RendezvousEvent, RendezvousOptions, Round } from './rendezvous_types.ts';
import type { RendezvousEvent, RendezvousOptions, Round } from './rendezvous_types.ts';

/** Signals kept for rounds this member has not built yet (the oldest go first). */
const MAX_EARLY_SIGNALS = 500;

export class RendezvousHandler {
  private client!: StoreClient;
  private current: Round | undefined;
  private latest: RoundEvent | undefined;
  private waitingNow: WaitingEvent | undefined;
  private localId = 0;
  private signals: SignalEvent[] = [];
  /** The links kept across rounds (reuseLinks), for this connection's member; made at its first round with a rank. */
  private pool: LinkPool | undefined;
  private readonly listeners = new Set<(e: RendezvousEvent) => void>();
  private readonly waiters = new Set<() => void>();
  private unsubscribe: Array<() => void> = [];
  private closed = false;
  /** A refusal that ends this member's part in the session (its token no longer opens it). */
  private fatal: Error | undefined;
  /** The page was hidden (closed, or put in the back/forward cache): its connections are gone. */
  private hidden = false;
  private rejoining = false;
  private storeDown = false;
  private readonly stopWatchingPage: Array<() => void>;
  /** The link options with their defaults, resolved (and checked) once for every round's links. */
  private readonly link: ResolvedLinkOptions;

  private constructor(private readonly options: RendezvousOptions) {
    this.link = resolveLinkOptions(options);
    // The store client and the group close themselves on pagehide; a page restored from the
    // back/forward cache must not run on with them dead: it joins again (or its group stays failed).
    this.stopWatchingPage = [
      onPageHide(() => {
        this.hidden = true;
        // The round's group tells its peers first: over the kept links, which close after it.
        this.current?.pg.leave();
        this.closePool('the page was hidden');
      }),
      onPageRestored(() => {
        if (!this.hidden) return;
        this.hidden = false;
        if (this.options.reconnect && !this.closed) void this.reconnect('this tab came back from the back/forward cache');
      }),
    ];
  }

  /**
   * Connects and joins the session's group. Rounds follow as the server forms them. `listener`
   * hears every event from the start, including those that come before joining completes.
   */
  static async start(options: RendezvousOptions, listener?: (e: RendezvousEvent) => void): Promise<RendezvousHandler> {
    const { min, max, rank } = options;
    if (!Number.isInteger(min) || !Number.isInteger(max) || min < 1 || max < min) {
      throw new RangeError(`the group's size must satisfy 1 <= min <= max, got min ${min}, max ${max}`);
    }
    if (rank !== undefined && (min !== max || !Number.isInteger(rank))) {
      throw new RangeError(`a rank can only be asked for in a group of fixed size (min = max), got rank ${rank} for ${min}..${max}`);
    }
    if (typeof RTCPeerConnection !== 'undefined' && !options.linkFactory) await loadSimplePeer();
    const handler = new RendezvousHandler(options);
    if (listener) handler.on(listener);
    await handler.connect(options.store);
    return handler;
  }

  on(listener: (e: RendezvousEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Members waiting to join the running round (they get in at the next regroup). */
  numNodesWaiting(): number {
    const w = this.waitingNow;
    return w && this.latest && w.round === this.latest.round && !this.latest.paused ? w.waiting : 0;
  }

  /** The connection to the server (it changes when the handler rejoins). */
  get store(): StoreClient {
    return this.client;
  }

  /**
   * Resolves with the first round newer than `after` (an id from an earlier Round, or 0) in
   * which this member has a rank. Paused rounds (below the minimum) are waited out.
   */
  nextRendezvous(after = 0, timeoutMs = this.options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS): Promise<Round> {
    return new Promise<Round>((resolve, reject) => {
      const check = () => {
        if (this.fatal) {
          done();
          reject(this.fatal);
        } else if (this.current && this.current.id > after) {
          done();
          resolve(this.current);
        }
      };
      const timer = setTimeout(() => {
        done();
        reject(new DistTimeoutError(this.describeWait(), timeoutMs));
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        this.waiters.delete(check);
      };
      this.waiters.add(check);
      check();
    });
  }

  /**
   * Asks the server to admit the waiting members now. Every rank of the round asks, after a
   * barrier, so that the new round interrupts nobody's collective. Resolves with the server's
   * latest round: the same one when nobody was waiting any more.
   */
  async regroup(round: Round): Promise<number> {
    return (await this.client.regroup(round.round)).round;
  }

  /**
   * Round `round` failed on this member, which waits for the next (`nextRendezvous`). A member
   * that left or was evicted makes the server form the next round by itself. When none did (a
   * link between two live tabs broke), nothing would, and every rank would wait out its timeout:
   * so when `failedRoundGraceMs` pass with no newer round on the same connection, this asks the
   * server for a new round of the same members. The server ignores it once a newer round exists.
   */
  async roundFailed(round: Round): Promise<void> {
    const client = this.client;
    const seen = this.latest;
    await new Promise((r) => setTimeout(r, this.options.failedRoundGraceMs ?? 6_000));
    if (this.closed || this.client !== client || client.isClosed || this.latest !== seen || seen?.round !== round.round) return;
    // A link that broke is what failed the round: the next round opens it afresh. Open links
    // stay: this rank may not have read the next round's event yet (a page held up on a loaded
    // machine), and closing every link then failed that round too, and the next, at 32 tabs.
    this.pool?.closeBroken(`round ${round.round} failed with every member still there`);
    // Refused when this member no longer has a rank in it (the server moved on): nothing to do.
    await client.regroup(round.round, true).catch(() => {});
  }

  /**
   * Leaves the group now and joins it again as a new member, for a member that must start over
   * (its GPU was lost, say). Closing the connection makes the server form a round of the others
   * at once, rather than after this member's heartbeats stop; `prepare` runs while they train on;
   * then the handler connects again (with the reconnect's backoff while the server cannot be
   * reached). The round that admits this member comes through `nextRendezvous`, as ever.
   */
  async rejoin(prepare?: () => Promise<void>): Promise<void> {
    if (this.closed) throw new GroupClosedError('the rendezvous handler was shut down');
    for (const off of this.unsubscribe) off();
    this.unsubscribe = [];
    const old = this.current;
    this.current = undefined;
    old?.pg.destroy(false);
    this.closePool('this member rejoins the group');
    this.client.close();
    await prepare?.();
    if (this.closed) return;
    try {
      await this.connect();
    } catch (err) {
      if (err instanceof UnauthorizedError || err instanceof SessionEndedError || err instanceof RendezvousClosedError) throw err;
      // The server is away for now: keep trying in the background; nextRendezvous waits for it.
      void this.reconnect(`could not rejoin: ${(err as Error).message}`);
    }
  }

  /**
   * The run is over (torch's set_closed): the server forms no more rounds, tells the members
   * waiting without a rank, and refuses arrivals with RendezvousClosedError. Needs a rank in the
   * running round; every rank may call it (the first closes it).
   */
  async closeRendezvous(): Promise<void> {
    await this.client.closeRendezvous();
  }

  /** Leaves the group and closes the connection. */
  shutdown(): void {
    this.closed = true;
    for (const off of this.stopWatchingPage) off();
    for (const off of this.unsubscribe) off();
    this.current?.pg.destroy(false);
    this.closePool('the run left the group');
    this.client?.close();
  }

  // --- Internals -----------------------------------------------------------------------------------

  /** The server's shared store went or came back (this connection's requests, or a hello refused): said once each way. */
  private storeState(e: StoreAvailabilityEvent): void {
    if (this.storeDown === !e.available) return;
    this.storeDown = !e.available;
    this.emit({ type: 'store', ...e });
  }

  private emit(e: RendezvousEvent): void {
    for (const l of this.listeners) l(e);
  }

  private describeWait(): string {
    const { session, min, max } = this.options;
    const w = this.waitingNow;
    const l = this.latest;
    if (min === max && (!l || l.paused)) {
      const arrived = w?.members ?? 1;
      return `${max - arrived} more rank${max - arrived === 1 ? '' : 's'} to join session "${session}" (${arrived} of ${max} joined)`;
    }
    if (l && !l.paused && l.rank < 0) {
      return `a free rank in session "${session}" (this member is spectating: round ${l.round} runs with ${l.worldSize} of at most ${l.max} ranks)`;
    }
    const now = l
      ? ` (round ${l.round} ${l.paused ? `is paused with ${w?.members ?? '?'} member(s)` : `has ${l.worldSize} ranks without this member`})`
      : '';
    return `a round of session "${session}" with at least ${min} rank(s)${now}`;
  }

  private async connect(existing?: StoreClient): Promise<void> {
    const { url, session, host, timeoutMs, min, max, rank, spectate } = this.options;
    // The token the last connection had: a newer one than the options' after the host removed a tab.
    const token = (this.client as StoreClient | undefined)?.token ?? this.options.token;
    const client =
      existing ??
      (await StoreClient.connect(url, host === undefined ? { session, token, timeoutMs } : { session, token, host, timeoutMs }));
    this.client = client;
    for (const off of this.unsubscribe) off();
    this.signals = [];
    this.closePool('the connection to the server changed');
    // Listen first: the round that includes this member may come before the reply.
    this.unsubscribe = [
      client.on('round', (e) => this.onRound(e)),
      client.on('waiting', (e) => {
        this.waitingNow = e;
        this.emit({
          type: 'waiting',
          waiting: e.waiting,
          members: e.members,
          min: e.min,
          max: e.max,
          running: this.latest?.round === e.round && !this.latest.paused,
          spectators: e.spectators,
        });
      }),
      client.on('control', (e) =>
        this.emit(e.min === undefined ? { type: 'control', action: e.action } : { type: 'control', action: e.action, min: e.min }),
      ),
      // The run ended without this member: no round will ever give it a rank.
      client.on('rendezvous-closed', (e) => {
        // A rank of that round hears it too: it matters only if its round failed (nextRendezvous).
        const rank = this.current?.round === e.round ? this.current.rank : null;
        const message =
          rank === null
            ? rendezvousClosedMessage(this.options.session, e.round, e.by)
            : rendezvousClosedOnRankMessage(this.options.session, e.round, e.by, rank);
        this.fatal = new RendezvousClosedError(message, this.options.session, e.round, e.by, rank);
        this.emit({ type: 'closed', round: e.round, by: e.by });
        for (const w of [...this.waiters]) w();
      }),
      // Signals for a round this member has not built yet are kept for it.
      client.on('signal', (e) => {
        if (this.pool?.onSignal(e)) return;
        this.signals.push(e);
        if (this.signals.length > MAX_EARLY_SIGNALS) this.signals.shift();
      }),
      client.on('token', (e) => this.options.onToken?.(e.token)),
      client.on('faults', (e) => this.emit({ type: 'faults', counts: e.counts, entries: e.entries })),
      client.on('store', (e) => this.storeState(e)),
      client.on('close', (e) => void this.onClose(e.code, e.reason)),
    ];
    try {
      const request = rank === undefined ? { min, max } : { min, max, rank };
      await client.rendezvous(spectate ? { ...request, spectate } : request, this.options.heartbeatIntervalMs);
    } catch (err) {
      for (const off of this.unsubscribe) off();
      if (!existing) client.close();
      throw err;
    }
  }

  private onRound(e: RoundEvent): void {
    this.latest = e;
    const old = this.current;
    if (old) old.pg.abort(new GroupClosedError(`round ${old.round} ended: the server formed round ${e.round}`));
    if (e.paused || e.rank < 0) {
      this.pool?.closeAll(`round ${e.round} has no rank for this member`);
      this.current = undefined;
      if (e.paused) this.emit({ type: 'paused', round: e.round, min: e.min });
      else this.emit({ type: 'spectating', round: e.round, worldSize: e.worldSize, max: e.max });
      old?.pg.destroy(false);
      return;
    }
    const client = this.client;
    const key = `${client.instance}.${e.round}`;
    const pool = this.poolFor(e);
    const early = this.signals.filter((s) => s.data.channel.startsWith(`pg:${key}:`));
    const forPool = this.signals.filter((s) => s.data.channel.startsWith('link:'));
    this.signals = [];
    pool?.enterRound(e.round, e.members);
    for (const s of forPool) pool?.onSignal(s);
    const pg = new ProcessGroup({
      ...this.options,
      // The user's ICE servers, else the ones the server gave this session (a TURN relay, say).
      iceServers: this.options.iceServers ?? this.client.iceServers,
      client: this.client,
      rank: e.rank,
      worldSize: e.worldSize,
      round: e.round,
      groupKey: key,
      ...(pool ? { linkFactory: pool.factoryFor(e.round) } : {}),
      timeoutMs: this.options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS,
      early,
      onStalled: () => this.onStalled(client),
    });
    this.current = {
      id: ++this.localId,
      round: e.round,
      key,
      rank: e.rank,
      worldSize: e.worldSize,
      members: e.members,
      pg,
      receivedAt: performance.now(),
    };
    old?.pg.destroy(false);
    this.emit({ type: 'round', id: this.current.id, round: e.round, rank: e.rank, worldSize: e.worldSize });
    for (const w of [...this.waiters]) w();
  }

  /** The link pool for this connection's member (made at its first round), or undefined when links are not reused. */
  private poolFor(e: RoundEvent): LinkPool | undefined {
    if (!(this.options.reuseLinks ?? !this.options.linkFactory)) return undefined;
    const base: PeerLinkFactory | undefined =
      this.options.linkFactory ?? (typeof RTCPeerConnection !== 'undefined' ? simplePeerLinkFactory() : undefined);
    const self = e.members[e.rank];
    if (!base || self === undefined) return undefined;
    if (this.pool?.self === self) return this.pool;
    this.closePool('this member has a new member id');
    const client = this.client;
    const link = this.link;
    this.pool = new LinkPool({
      self,
      instance: client.instance,
      base,
      sendSignal: (rank, data) => client.signal(rank, data),
      link: {
        iceServers: this.options.iceServers ?? client.iceServers,
        highWaterMark: link.highWaterMark,
        windowBytes: link.linkWindowBytes,
        stallTimeoutMs: link.peerTimeoutMs,
      },
    });
    return this.pool;
  }

  private closePool(reason: string): void {
    this.pool?.close(reason);
    this.pool = undefined;
  }

  /**
   * This member's page was paused past its stall bound, and its round's group failed. The server
   * may still count it in that round (its heartbeats resumed before the eviction bound), and then
   * the others would wait for a new round that never forms: leave it now, and join again.
   */
  private onStalled(client: StoreClient): void {
    if (!this.options.reconnect || this.closed || client !== this.client || client.isClosed) return;
    client.close(CloseCode.STALLED, 'paused past its stall bound: joining again');
  }

  /** The server went away (restart, network) or evicted this member: join again, with backoff. */
  private async onClose(code: number, reason: string): Promise<void> {
    if (this.closed) return;
    const current = this.current;
    this.current = undefined;
    // The socket this tab closed on pagehide may report any code (1006 if the close did not
    // finish): a hidden page does not rejoin until it is shown again.
    if (this.hidden) return;
    switch (afterClose(code)) {
      case 'ended':
        // The host ended the session: rejoining would only be refused.
        this.fatal = new SessionEndedError(
          reason || `the host ended session "${this.options.session}": create a new one`,
          this.options.session,
        );
        for (const w of [...this.waiters]) w();
        return;
      case 'left':
        return; // this tab is going away; if the page is restored, onPageRestored rejoins
      case 'removed': {
        // The host removed this tab and changed the session's link: rejoining would only be refused.
        const { session } = this.options;
        this.fatal = new RemovedByHostError(
          `the host removed this tab from session "${session}" and changed the session's link, so this tab cannot rejoin; its replica stopped at its last committed step and can still be saved`,
          session,
        );
        current?.pg.abort(this.fatal);
        this.closePool('the host removed this tab');
        for (const w of [...this.waiters]) w();
        return;
      }
      case 'rejoin':
        break;
    }
    if (!this.options.reconnect) return;
    const why =
      code === CloseCode.EVICTED
        ? `the server evicted this tab (${reason}): its page was paused, or its network stalled`
        : code === CloseCode.STALLED
          ? 'this tab was paused past its stall bound, so it left its round: joining again'
          : `connection closed (${code}${reason ? ` ${reason}` : ''})`;
    await this.reconnect(why);
  }

  /** Joins the session again on a new connection, with backoff, until it works, fails for good, or time runs out. */
  private async reconnect(why: string): Promise<void> {
    if (this.rejoining) return;
    this.rejoining = true;
    try {
      await this.reconnectLoop(why);
    } finally {
      this.rejoining = false;
    }
  }

  private async reconnectLoop(why: string): Promise<void> {
    const deadline = Date.now() + (this.options.reconnectTimeoutMs ?? 600_000);
    for (let attempt = 1; !this.closed; attempt++) {
      const waitMs = Math.min(5_000, 250 * 2 ** attempt);
      this.emit({ type: 'reconnecting', attempt, waitMs, reason: why });
      await new Promise((r) => setTimeout(r, waitMs));
      try {
        await this.connect();
        // Its hello was answered: the token was read from the server's store.
        this.storeState({ available: true });
        this.emit({ type: 'reconnected' });
        return;
      } catch (err) {
        // The server's shared store refused this member's hello (its token is checked there): say so, and try again.
        if (isStoreUnavailable(err))
          this.storeState({ available: false, message: err.message, retryInMs: Math.min(5_000, 250 * 2 ** (attempt + 1)) });
        // The session's token no longer opens it (the name was claimed anew), its host ended it
        // meanwhile, or its run ended: retrying cannot help.
        if (err instanceof UnauthorizedError || err instanceof SessionEndedError || err instanceof RendezvousClosedError) {
          this.fatal = err;
          for (const w of [...this.waiters]) w();
          return;
        }
        if (Date.now() > deadline) return; // nextRendezvous times out and says what it waited for
      }
    }
  }
}
