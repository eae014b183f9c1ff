/**
 * The elastic agent (what torchrun's agent and rendezvous are to a worker): joins a session with
 * a size range, follows the server's generations, and hands out one ProcessGroup per generation.
 * When the server goes away it reconnects with backoff and joins again; the training loop, which
 * holds the model, decides where to resume from.
 */
import { DistTimeoutError } from './errors.ts';
import { ProcessGroup, type InitProcessGroupOptions } from './process_group.ts';
import { CloseCode, type GenerationEvent, type SignalEvent } from './protocol.ts';
import { StoreClient } from './store.ts';
import { loadSimplePeer } from './peer_link.ts';

export interface ElasticOptions extends Omit<InitProcessGroupOptions, 'worldSize' | 'rank' | 'store' | 'groupKey'> {
  min: number;
  max: number;
  /** How often to tell the server this tab is alive. Default 1 s. */
  heartbeatIntervalMs?: number;
  /** How long to keep trying to reach the server after it went away. Default 10 min. */
  reconnectTimeoutMs?: number;
}

/** One generation this member takes part in. */
export interface Generation {
  /** Counts generations seen by this agent (server generation numbers restart with the server). */
  id: number;
  /** The server's generation number. */
  gen: number;
  rank: number;
  worldSize: number;
  pg: ProcessGroup;
}

export type AgentEvent =
  | { type: 'generation'; id: number; gen: number; rank: number; worldSize: number }
  | { type: 'paused'; gen: number; members: number; min: number }
  | { type: 'waiting'; gen: number; reason: string }
  | { type: 'join-pending'; waiting: number }
  | { type: 'reconnecting'; attempt: number; waitMs: number; reason: string }
  | { type: 'reconnected' };

export class ElasticAgent {
  private store!: StoreClient;
  private current: Generation | undefined;
  private latest: GenerationEvent | undefined;
  private localId = 0;
  private waitingToJoin = 0;
  private signals: SignalEvent[] = [];
  private readonly listeners = new Set<(e: AgentEvent) => void>();
  private readonly waiters = new Set<() => void>();
  private unsubscribe: Array<() => void> = [];
  private closed = false;

  private constructor(private readonly options: ElasticOptions) {}

  /** Connects and joins the session elastically. Generations follow as the server forms them. */
  static async start(options: ElasticOptions): Promise<ElasticAgent> {
    if (!Number.isInteger(options.min) || !Number.isInteger(options.max) || options.min < 1 || options.max < options.min) {
      throw new RangeError(`elastic sizes must satisfy 1 <= min <= max, got min ${options.min}, max ${options.max}`);
    }
    if (typeof RTCPeerConnection !== 'undefined' && !options.linkFactory) await loadSimplePeer();
    const agent = new ElasticAgent(options);
    await agent.connect();
    return agent;
  }

  on(listener: (e: AgentEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Members waiting to join the current generation (they get in at the next regroup). */
  get pendingJoins(): number {
    return this.waitingToJoin;
  }

  get storeClient(): StoreClient {
    return this.store;
  }

  /**
   * Resolves with the first generation newer than `after` (an id from an earlier Generation, or
   * 0) in which this member has a rank. Paused generations (below the minimum) are waited out.
   */
  next(after: number, timeoutMs = this.options.timeoutMs ?? 600_000): Promise<Generation> {
    return new Promise<Generation>((resolve, reject) => {
      const check = () => {
        if (this.current && this.current.id > after) {
          done();
          resolve(this.current);
        }
      };
      const timer = setTimeout(() => {
        done();
        const l = this.latest;
        reject(
          new DistTimeoutError(
            `a new generation of session "${this.options.session}" with at least ${this.options.min} rank(s)${l ? ` (the latest, ${l.gen}, has ${l.paused ? 'too few members' : `${l.worldSize} ranks without this tab`})` : ''}`,
            timeoutMs,
          ),
        );
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        this.waiters.delete(check);
      };
      this.waiters.add(check);
      check();
    });
  }

  /** Asks the server to admit waiting members now (every rank of the generation asks). */
  async requestRegroup(g: Generation): Promise<void> {
    await this.store.regroup(g.gen);
  }

  close(): void {
    this.closed = true;
    for (const off of this.unsubscribe) off();
    this.current?.pg.destroy(false);
    this.store?.close();
  }

  // --- Internals -----------------------------------------------------------------------------------

  private emit(e: AgentEvent): void {
    for (const l of this.listeners) l(e);
  }

  private async connect(): Promise<void> {
    const store = await StoreClient.connect(this.options.url, { session: this.options.session, timeoutMs: this.options.timeoutMs });
    this.store = store;
    for (const off of this.unsubscribe) off();
    this.signals = [];
    this.unsubscribe = [
      store.on('generation', (e) => this.onGeneration(e)),
      store.on('join-pending', (e) => {
        if (e.gen === this.latest?.gen) {
          this.waitingToJoin = e.waiting;
          this.emit({ type: 'join-pending', waiting: e.waiting });
        }
      }),
      // Signals for a generation this member has not built yet are kept for it.
      store.on('signal', (e) => {
        this.signals.push(e);
        if (this.signals.length > 500) this.signals.shift();
      }),
      store.on('close', (e) => void this.onClose(e.code, e.reason)),
    ];
    await store.rendezvous(this.options.min, this.options.max, this.options.heartbeatIntervalMs);
  }

  private onGeneration(e: GenerationEvent): void {
    this.latest = e;
    this.waitingToJoin = 0;
    const old = this.current;
    if (old) old.pg.abort(new Error(`generation ${old.gen} ended: the server formed generation ${e.gen}`));
    if (e.paused || e.rank < 0) {
      this.current = undefined;
      if (e.paused) this.emit({ type: 'paused', gen: e.gen, members: e.members.length, min: e.min });
      else this.emit({ type: 'waiting', gen: e.gen, reason: `the group is at its maximum of ${e.max}` });
      return;
    }
    const groupKey = `${this.store.instance}.${e.gen}`;
    const early = this.signals.filter((s) => s.data.channel.startsWith(`pg:${groupKey}:`));
    this.signals = [];
    const pg = new ProcessGroup(this.store, e.rank, e.worldSize, { ...this.options, worldSize: e.worldSize, groupKey }, early);
    this.current = { id: ++this.localId, gen: e.gen, rank: e.rank, worldSize: e.worldSize, pg };
    old?.pg.destroy(false);
    this.emit({ type: 'generation', id: this.current.id, gen: e.gen, rank: e.rank, worldSize: e.worldSize });
    for (const w of [...this.waiters]) w();
  }

  /** The server went away (restart, network) or evicted this tab: join again, with backoff. */
  private async onClose(code: number, reason: string): Promise<void> {
    if (this.closed) return;
    this.current?.pg.abort(new Error(`lost the server (${code} ${reason || 'closed'})`));
    this.current = undefined;
    const why = code === CloseCode.EVICTED ? `evicted by the server: ${reason}` : `connection closed (${code}${reason ? ` ${reason}` : ''})`;
    const deadline = Date.now() + (this.options.reconnectTimeoutMs ?? 600_000);
    for (let attempt = 1; !this.closed; attempt++) {
      const waitMs = Math.min(5_000, 250 * 2 ** attempt);
      this.emit({ type: 'reconnecting', attempt, waitMs, reason: why });
      await new Promise((r) => setTimeout(r, waitMs));
      try {
        await this.connect();
        this.emit({ type: 'reconnected' });
        return;
      } catch {
        if (Date.now() > deadline) return; // next() times out and says what it waited for
      }
    }
  }
}
