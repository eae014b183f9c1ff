/**
 * A member's pulse: a second socket, on `/ws?pulse`, that a dedicated Worker of the member's tab
 * opens and beats on (src/c10d/pulse.ts). A Worker runs on its own thread, so it beats on while
 * the page's main thread is busy (a long cpu step, a loaded laptop) and sends no heartbeat; a
 * frozen tab, a sleeping computer or a killed one stops its Worker too. The server judges a
 * member on both (`judge`): silent on its socket but beating, it is busy, and is kept for longer.
 *
 * The socket's first frame is the key the member got from its `pulse` request (minted for that
 * connection alone, so no one else can beat for it); every later frame is a beat. A member holds
 * at most one pulse: a new one replaces the old.
 */
import { randomBytes } from 'node:crypto';
import type { WebSocket } from 'ws';
import { CloseCode } from '../src/wire/protocol.ts';
import type { Connection } from './connection.ts';
import type { ServerContext } from './server_context.ts';

/** The path's query that makes a socket on `/ws` a pulse. */
export const PULSE_QUERY = 'pulse';

/** The key a member's Worker presents: minted once per connection, on its first `pulse` request. */
export function pulseKey(conn: Connection): string {
  conn.pulseKey ??= randomBytes(18).toString('base64url');
  return conn.pulseKey;
}

/**
 * Serves one pulse socket. It has `helloTimeoutMs` to present a member's key; `release` gives
 * back its place in the address's socket count once it belongs to a member (whose own socket
 * counts already) or closes.
 */
export function acceptPulse(ctx: ServerContext, ws: WebSocket, release: () => void): void {
  let member: Connection | undefined;
  let released = false;
  const free = () => {
    if (!released) release();
    released = true;
  };
  const timer = setTimeout(
    () => ws.close(CloseCode.HELLO_TIMEOUT, `no pulse key within ${ctx.limits.helloTimeoutMs} ms`),
    ctx.limits.helloTimeoutMs,
  );
  timer.unref();
  ws.on('message', (data, isBinary) => {
    if (member) {
      member.pulseSeen = Date.now();
      return;
    }
    const key = isBinary ? '' : data.toString();
    const owner = [...ctx.connections].find((c) => c.pulseKey !== undefined && c.pulseKey === key);
    if (!owner || owner.memberId === undefined) {
      ws.close(CloseCode.UNAUTHORIZED, 'not the pulse key of a member: a member asks for its key with a `pulse` request');
      return;
    }
    clearTimeout(timer);
    free();
    member = owner;
    owner.attachPulse(ws);
  });
  ws.on('close', () => {
    clearTimeout(timer);
    free();
    member?.detachPulse(ws);
  });
}

/** What the liveness check decides for a member silent on its own socket for `silentMs`. */
export type Verdict = { keep: true; busy: boolean } | { keep: false; reason: string };

/**
 * Two bounds. Silent past `heartbeatTimeoutMs` with a pulse that beat within that bound too: busy,
 * kept until `busyTimeoutMs` (a page that never yields, or one paused in a debugger, is evicted
 * then). Silent past `heartbeatTimeoutMs` without a fresh pulse (no Worker, or one that stopped
 * with its page): frozen or gone, evicted.
 */
export function judge(silentMs: number, pulseAgeMs: number | undefined, heartbeatTimeoutMs: number, busyTimeoutMs: number): Verdict {
  if (silentMs <= heartbeatTimeoutMs) return { keep: true, busy: false };
  const beating = pulseAgeMs !== undefined && pulseAgeMs <= heartbeatTimeoutMs;
  if (beating && silentMs <= busyTimeoutMs) return { keep: true, busy: true };
  return {
    keep: false,
    reason: beating
      ? `its page sent nothing for ${silentMs} ms although its Worker still beat (busy past ${busyTimeoutMs} ms: a script that never yields, or paused in a debugger)`
      : `nothing received from it for ${silentMs} ms (frozen or hung)`,
  };
}

/** A liveness bound in the environment the server cannot use; the message says what to give. */
export class LivenessConfigError extends Error {
  override name = 'LivenessConfigError';
}

/**
 * `npm start`'s liveness bounds from the environment: HEARTBEAT_TIMEOUT_MS and BUSY_TIMEOUT_MS
 * (whole milliseconds, 100 to 600000), each left to its default when unset.
 */
export function livenessBoundsFromEnv(env: Record<string, string | undefined>): { heartbeatTimeoutMs?: number; busyTimeoutMs?: number } {
  const bounds: { heartbeatTimeoutMs?: number; busyTimeoutMs?: number } = {};
  for (const [name, key] of [
    ['HEARTBEAT_TIMEOUT_MS', 'heartbeatTimeoutMs'],
    ['BUSY_TIMEOUT_MS', 'busyTimeoutMs'],
  ] as const) {
    const raw = env[name];
    if (raw === undefined || raw === '') continue;
    const ms = Number(raw);
    if (!/^\d+$/.test(raw) || ms < 100 || ms > 600_000)
      throw new LivenessConfigError(
        `${name}=${JSON.stringify(raw).slice(0, 40)} is not a time the server can use: give whole milliseconds from 100 to 600000, e.g. ${name}=${key === 'busyTimeoutMs' ? 20000 : 8000}`,
      );
    bounds[key] = ms;
  }
  if (bounds.heartbeatTimeoutMs !== undefined && bounds.busyTimeoutMs !== undefined && bounds.busyTimeoutMs < bounds.heartbeatTimeoutMs) {
    throw new LivenessConfigError(
      `BUSY_TIMEOUT_MS (${bounds.busyTimeoutMs}) is shorter than HEARTBEAT_TIMEOUT_MS (${bounds.heartbeatTimeoutMs}): a busy tab is kept at least as long as a silent one, so give at least ${bounds.heartbeatTimeoutMs}`,
    );
  }
  return bounds;
}
