/**
 * What the server's parts share (the WebSocket accept path, the dispatch and its handlers): made
 * once by `startServer` from its options and passed to each part, rather than closed over.
 */
import type { Limits } from '../src/wire/protocol.ts';
import type { Connection } from './connection.ts';
import type { IceConfig } from './ice.ts';
import type { JoinRate } from './join_rate.ts';
import type { QuietLog } from './limits.ts';
import type { SessionTokens } from './session_tokens.ts';
import type { Sessions } from './sessions.ts';
import type { SessionRelay } from './relay.ts';

export interface ServerContext {
  /** Every limit, options' over `DEFAULT_LIMITS`. */
  readonly limits: Limits;
  /** Where server messages go (ServerOptions.log). */
  readonly log: (line: string) => void;
  /** The log for refusals and closes: the first of each kind, then counts. */
  readonly quiet: QuietLog;
  readonly sessions: Sessions;
  readonly tokens: SessionTokens;
  /** Open sockets that passed the per-address limit, every session's. */
  readonly connections: Set<Connection>;
  /** The STUN/TURN servers handed to members. */
  readonly ice: IceConfig;
  /** Changes on every start, so links made through an earlier server never match new ones. */
  readonly instance: string;
  /** ServerOptions.settleMs. */
  readonly settleMs: number;
  /** ServerOptions.heartbeatTimeoutMs. */
  readonly heartbeatTimeoutMs: number;
  /** ServerOptions.busyTimeoutMs. */
  readonly busyTimeoutMs: number;
  /** Sessions whose tokens the server keeps (TOO_MANY_SESSIONS past it). */
  readonly maxKnownSessions: number;
  /** ServerOptions.adminSecret: a hello presenting it may create its session. */
  readonly adminSecret: string;
  /** ServerOptions.loopbackCreates. */
  readonly loopbackCreates: boolean;
  /** How fast an address may join a session's group (ServerOptions.joinRate). */
  readonly joins: JoinRate;
  /** On a shared engine: each session's owner server, and the sockets relayed to it (relay.ts). */
  readonly relay?: SessionRelay;
}
