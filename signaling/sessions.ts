/**
 * The server's sessions and the server-wide limits on them: at most `maxSessions` at once, and
 * at most `maxServerBytes` in all their stores together. A session's store lives while it has
 * sockets and for `idleMs` after its last one left; dropping it frees its place and its bytes (its
 * token, and so its name, for a day more: see SessionTokens).
 */
import { ErrorCode, type Limits } from '../src/wire/protocol.ts';
import { Session } from './session.ts';
import { StoreRefusal, type ByteBudget, type StoreQuota } from './store.ts';
import type { SessionStore } from './session_store.ts';
import type { SessionTokens } from './session_tokens.ts';

export class Sessions {
  readonly map = new Map<string, Session>();
  /** The bytes of every session's store, against `maxServerBytes`. */
  readonly bytes: ByteBudget;
  private readonly sweeper: ReturnType<typeof setInterval>;

  constructor(
    private readonly limits: Limits,
    private readonly tokens: SessionTokens,
    private readonly idleMs: number,
    /** Where a session's keys live: none, in this server's memory; else the shared engine's (engine_store.ts). */
    private readonly engine?: { open(name: string, quota: StoreQuota): SessionStore; close(): void },
  ) {
    this.bytes = { used: 0, max: limits.maxServerBytes };
    this.sweeper = setInterval(
      () => {
        const now = Date.now();
        for (const [name, s] of this.map) {
          if (s.connections === 0 && now - s.idleSince > idleMs) this.drop(name);
          // Sockets here: the engine keeps the session's keys (other servers may have let it go).
          else if (s.connections > 0) s.store.touch?.();
        }
        this.tokens.expire(now);
      },
      Math.min(idleMs, 60_000),
    );
    this.sweeper.unref();
  }

  get(name: string): Session | undefined {
    return this.map.get(name);
  }

  /**
   * Refuses (TOO_MANY_SESSIONS) to make a new session while the server holds `maxSessions`.
   * Places come free as the sweeper drops idle sessions. (Dropping an idle one early to make room
   * would let whoever fills the server free, and then claim, the name of a session whose tabs are
   * all reloading.)
   */
  checkRoomFor(name: string): void {
    if (this.map.has(name) || this.map.size < this.limits.maxSessions) return;
    throw new StoreRefusal(
      ErrorCode.TOO_MANY_SESSIONS,
      `the server holds its maximum of ${this.limits.maxSessions} sessions; join an existing session or try again later (a session is dropped ${Math.round(this.idleMs / 1000)} s after its last socket closed)`,
      { limit: this.limits.maxSessions },
    );
  }

  /** The session `name`, made if needed (its token is claimed already and kept after a refusal, as after a drop). */
  open(name: string): Session {
    let session = this.map.get(name);
    if (session) return session;
    try {
      // Again: another hello may have taken the last place while this one's token was checked.
      this.checkRoomFor(name);
    } catch (err) {
      this.tokens.release(name);
      throw err;
    }
    const quota = { maxKeys: this.limits.maxKeysPerSession, maxBytes: this.limits.maxBytesPerSession, server: this.bytes };
    session = new Session(name, quota, this.engine?.open(name, quota));
    this.map.set(name, session);
    return session;
  }

  /** Drops a session's store: its keys, its bytes from the server's budget, its place. Its token is kept a while (SessionTokens). */
  drop(name: string): void {
    const ended = this.map.get(name)?.ended ?? false;
    this.map.get(name)?.close();
    this.map.delete(name);
    // A session its host ended is over: its links must not bring it back.
    if (ended) this.tokens.forget(name);
    else this.tokens.release(name);
  }

  close(): void {
    clearInterval(this.sweeper);
    for (const s of this.map.values()) s.close();
    this.engine?.close();
  }
}
