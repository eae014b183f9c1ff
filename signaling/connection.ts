/**
 * One client socket on the server and the limits that apply to it alone: it must say `hello`
 * within `helloTimeoutMs`, answer the server's pings, and read its replies (no more than
 * `maxBufferedBytes` may wait to be sent to it). A socket that breaks one of these is cut off with
 * a close code and a reason; the rest of the server never waits on it.
 */
import type { WebSocket } from 'ws';
import { CloseCode, type Limits, type ServerMessage } from '../src/wire/protocol.ts';
import type { Session } from './session.ts';
import type { QuietLog } from './limits.ts';

/** How long a socket we closed may take to finish the close handshake before it is destroyed. */
const CLOSE_GRACE_MS = 1_000;

export class Connection {
  session?: Session;
  /** It presented the session's host secret at `hello`: it may send `control`. */
  isHost = false;
  /** Member id in the session's rendezvous, once the socket joined the group. */
  memberId?: number;
  /** Bad messages and counted refusals so far (`maxErrorsPerSocket`). */
  errors = 0;
  /** Blocking calls (get, wait, multiGet, a deferred regroup) waiting on the server. */
  pending = 0;
  /** The first `hello` while it is being handled. */
  hello?: Promise<void>;
  /** When the socket last sent anything (members are evicted when silent too long). */
  lastSeen = Date.now();
  /** The key its Worker's pulse socket presents (signaling/pulse.ts), once it asked for one. */
  pulseKey?: string;
  /** When its pulse last beat, while it has one. */
  pulseSeen?: number;
  /** Its page is silent while its pulse beats (logged once per spell). */
  busySince?: number;
  private pulse: WebSocket | undefined;
  /** It answered the last ping (or none was sent yet). */
  private alive = true;
  private cut = false;
  private helloTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    readonly ws: WebSocket,
    /** The remote address, for limits and logs. */
    readonly address: string,
    private readonly limits: Limits,
    private readonly log: QuietLog,
  ) {
    ws.on('pong', () => (this.alive = true));
    this.helloTimer = setTimeout(() => {
      this.close(CloseCode.HELLO_TIMEOUT, `no hello within ${limits.helloTimeoutMs} ms`);
    }, limits.helloTimeoutMs);
    this.helloTimer.unref();
  }

  /** `hello` succeeded: the socket may stay. */
  entered(session: Session): void {
    this.session = session;
    clearTimeout(this.helloTimer);
  }

  /** The socket closed, by either side. */
  closed(): void {
    clearTimeout(this.helloTimer);
    this.pulse?.close(1000, 'its member closed');
  }

  /** Its Worker's pulse socket presented its key: the one it beats on from now (an older one is closed). */
  attachPulse(ws: WebSocket): void {
    if (this.pulse && this.pulse !== ws) this.pulse.close(1000, 'replaced by a newer pulse');
    this.pulse = ws;
    this.pulseSeen = Date.now();
    if (this.cut || this.ws.readyState !== this.ws.OPEN) ws.close(1000, 'its member closed');
  }

  /** A pulse socket closed: judged without a pulse until another comes. */
  detachPulse(ws: WebSocket): void {
    if (this.pulse !== ws) return;
    this.pulse = undefined;
    this.pulseSeen = undefined;
  }

  /**
   * Sends a message unless the socket is closing. A peer that does not read its replies makes
   * them pile up here: past `maxBufferedBytes` it is cut off rather than growing the server's
   * memory (so at most that plus one reply is ever held for it).
   */
  send(message: ServerMessage): void {
    if (this.ws.readyState !== this.ws.OPEN) return;
    this.ws.send(JSON.stringify(message));
    if (this.ws.bufferedAmount > this.limits.maxBufferedBytes) {
      this.close(CloseCode.SLOW_READER, `not reading: over ${this.limits.maxBufferedBytes} bytes waiting to be sent`);
    }
  }

  /**
   * One tick of the liveness check, every `pingIntervalMs`: a socket that did not answer the
   * previous ping is destroyed (its 'close' follows, as for any close); the others are pinged.
   */
  probe(): void {
    if (!this.alive) {
      this.note('no pong', `did not answer a ping within ${this.limits.pingIntervalMs} ms: cut off`);
      this.ws.terminate();
      return;
    }
    this.alive = false;
    if (this.ws.readyState === this.ws.OPEN) this.ws.ping();
  }

  /** Closes with a code and a reason, and destroys the socket if the peer does not finish the close in time. */
  close(code: number, reason: string): void {
    if (this.cut) return;
    this.cut = true;
    this.note(`close ${code}`, reason);
    this.ws.close(code, reason);
    // A peer that reads nothing (or is frozen) never answers the close handshake.
    setTimeout(() => this.ws.terminate(), CLOSE_GRACE_MS).unref();
  }

  private note(kind: string, what: string): void {
    const session = this.session ? ` (session "${this.session.name}")` : '';
    this.log.note(`socket ${kind}`, `[server] socket from ${this.address}${session}: ${what}`);
  }
}
