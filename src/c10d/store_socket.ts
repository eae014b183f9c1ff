/**
 * The store client's socket: the URL it goes to, the WebSocket class for this runtime (the
 * browser's, or `ws` in Node), and opening it, with why it failed in words a user can act on
 * (an untrusted certificate, a server that closed at once).
 */
import { ConnectionClosedError, DistTimeoutError } from '../wire/errors.ts';
import type { StoreClientOptions } from './store_options.ts';

/** Minimal structural view of a WebSocket: the browser's and `ws`'s both fit. */
export interface SocketLike {
  readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
}
type SocketConstructor = new (url: string, protocols?: string[], options?: { ca: StoreClientOptions['ca'] }) => SocketLike;

/** WebSocket.OPEN, the same in browsers and in `ws`. */
export const OPEN = 1;

/** The browser's WebSocket, or `ws`'s in Node (and wherever a CA must be given). */
async function socketConstructor(withCa: boolean): Promise<SocketConstructor> {
  const native = (globalThis as { WebSocket?: unknown }).WebSocket;
  if (withCa) {
    // Only `ws` takes a CA; a browser (whose bundle may polyfill `process`) has no Node version.
    const node = (globalThis as { process?: { versions?: { node?: string } } }).process?.versions?.node;
    if (!node) throw new TypeError('the `ca` option is for Node: a browser trusts the certificates its own certificate store trusts');
  } else if (native) return native as SocketConstructor;
  // Node 20 has no global WebSocket; `ws` is the implementation the server uses too.
  const ws = await import('ws');
  return ws.WebSocket as unknown as SocketConstructor;
}

/** Accepts the page URL (http://host:port/...) or the socket URL (ws://host:port/ws). */
export function storeSocketUrl(url: string): string {
  const u = new URL(url);
  if (u.protocol === 'http:') u.protocol = 'ws:';
  else if (u.protocol === 'https:') u.protocol = 'wss:';
  else if (u.protocol !== 'ws:' && u.protocol !== 'wss:') {
    throw new TypeError(`store URL must be http(s):// or ws(s)://, got ${url}`);
  }
  u.pathname = '/ws';
  u.search = '';
  u.hash = '';
  return u.toString();
}

/** Node's TLS error codes for a server certificate it does not trust. */
const UNTRUSTED_CERT = new Set([
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
]);

/** ": <ws's reason>" for a failed connect, with what to do about an untrusted certificate. */
function whyNotConnected(failure: { message?: string; error?: { code?: string } } | undefined): string {
  const message = typeof failure?.message === 'string' && failure.message ? failure.message : undefined;
  if (!message) return '';
  const code = failure?.error?.code;
  if (code && UNTRUSTED_CERT.has(code)) {
    return `: ${message}. Trust the server's certificate: pass it as \`ca\` (StoreClient.connect's option; a self-signed server's is certs/cert.pem) or set NODE_EXTRA_CA_CERTS to its file`;
  }
  if (code === 'ERR_TLS_CERT_ALTNAME_INVALID') return `: ${message}. Connect by a name or address the server's certificate covers`;
  return `: ${message}`;
}

/** An open socket, and the close the server sent at once after accepting it, if it did. */
export interface OpenedSocket {
  socket: SocketLike;
  closedEarly: { code: number; reason: string } | undefined;
}

/** Opens a socket to `wsUrl` within `connectTimeoutMs` (DistTimeoutError), or says why it could not. */
export async function openSocket(wsUrl: string, options: StoreClientOptions, connectTimeoutMs: number): Promise<OpenedSocket> {
  const Ctor = await socketConstructor(options.ca !== undefined);
  const socket = options.ca === undefined ? new Ctor(wsUrl) : new Ctor(wsUrl, undefined, { ca: options.ca });
  // The server may close right after accepting (too many sockets from this address): keep why.
  let closedEarly: { code: number; reason: string } | undefined;
  // Node's `ws` says why a socket failed (a certificate it does not trust); browsers never do.
  let failure: { message?: string; error?: { code?: string } } | undefined;
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      socket.close();
      reject(new DistTimeoutError(`the store server at ${wsUrl} to accept the connection`, connectTimeoutMs));
    }, connectTimeoutMs);
    socket.onopen = () => {
      clearTimeout(timer);
      resolve();
    };
    socket.onerror = (ev) => {
      failure = typeof ev === 'object' && ev !== null ? (ev as typeof failure) : undefined;
    };
    socket.onclose = (ev) => {
      clearTimeout(timer);
      closedEarly = { code: ev.code, reason: ev.reason };
      reject(
        new ConnectionClosedError(
          `could not connect to the store server at ${wsUrl} (code ${ev.code})${whyNotConnected(failure)}`,
          ev.code,
          ev.reason,
        ),
      );
    };
  });
  return { socket, closedEarly };
}
