/**
 * Where other machines can reach the server (`GET /api/info`, `RunningServer.urls`, what
 * `npm start` prints), and what to tell a person whose server could not listen.
 */
import { networkInterfaces, type NetworkInterfaceInfo } from 'node:os';
import { createServer as createNetServer } from 'node:net';
import type { IncomingMessage, ServerResponse } from 'node:http';

/** What `GET /api/info` answers. */
export interface ServerInfo {
  /** Page URLs other machines can open (empty when the server listens on loopback only). */
  urls: string[];
  /** Whether the page is served over HTTPS (`startServer({ tls })`, `npm start -- --https`). */
  secure: boolean;
  /** The address and port the server listens on, e.g. "0.0.0.0:8080". */
  listening: string;
  /** Under TLS: the certificate's SHA-256 fingerprint ("AB:CD:...") and whether it is self-signed (browsers warn until trusted). */
  certificate?: { fingerprint256: string; selfSigned: boolean };
  /** Whether the host offers its own model and data (`npm start -- --model DIR --data DIR`): the create form offers "user" only then. What they are is the sessions' to read (GET /api/offer, with a token). */
  offers: { model: boolean; data: boolean };
}

const WILDCARD = new Set(['0.0.0.0', '::', '']);

/** Loopback names and addresses: reachable from this machine only. */
/** A loopback name or address (the server's own machine), also as IPv4-mapped IPv6. */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[(.*)\]$/, '$1');
  return h === 'localhost' || h === '::1' || h.startsWith('127.') || h === '0:0:0:0:0:0:0:1' || h.startsWith('::ffff:127.');
}

/** IPv6 link-local (fe80::/10) addresses need a zone (%eth0) that no URL can carry to a browser. */
export function isLinkLocal6(address: string): boolean {
  return /^fe[89ab][0-9a-f]:/i.test(address);
}

function urlOf(address: string, port: number, scheme: 'http' | 'https'): string {
  return `${scheme}://${address.includes(':') ? `[${address}]` : address}:${port}/`;
}

/**
 * The page URLs other machines can open, for a server listening on `listenHost`:`port`.
 * - On every interface: one per non-internal IPv4 address, then (when listening on "::", which
 *   also takes IPv6) one per non-internal, non-link-local IPv6 address. "0.0.0.0" takes IPv4
 *   only, so no IPv6 URL would answer.
 * - On one non-loopback address or name: that one.
 * - On loopback: none.
 */
export function lanUrls(
  listenHost: string,
  port: number,
  interfaces: NodeJS.Dict<NetworkInterfaceInfo[]> = networkInterfaces(),
  scheme: 'http' | 'https' = 'http',
): string[] {
  if (!WILDCARD.has(listenHost)) return isLoopback(listenHost) ? [] : [urlOf(listenHost.replace(/^\[(.*)\]$/, '$1'), port, scheme)];
  const all = Object.values(interfaces)
    .flatMap((list) => list ?? [])
    .filter((a) => !a.internal);
  const v4 = all.filter((a) => a.family === 'IPv4').map((a) => a.address);
  const v6 = listenHost === '::' ? all.filter((a) => a.family === 'IPv6' && !isLinkLocal6(a.address)).map((a) => a.address) : [];
  // An address on two interfaces (a bridge) is one URL.
  return [...new Set([...v4, ...v6])].map((a) => urlOf(a, port, scheme));
}

/** "0.0.0.0:8080", "[::]:8080", "127.0.0.1:8080". */
export function listeningLabel(listenHost: string, port: number): string {
  return `${listenHost.includes(':') ? `[${listenHost}]` : listenHost || '0.0.0.0'}:${port}`;
}

/**
 * Answers `GET /api/info` (returns false for other paths), its `urls` to the server's own machine
 * only. The Host and Origin checks ran before.
 */
export function infoHandler(info: () => ServerInfo): (req: IncomingMessage, res: ServerResponse) => boolean {
  return (req, res) => {
    let pathname: string;
    try {
      pathname = new URL(req.url ?? '/', 'http://x').pathname;
    } catch {
      return false;
    }
    if (pathname !== '/api/info') return false;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res
        .writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' })
        .end(`${req.method} is not allowed on /api/info: use GET`);
      return true;
    }
    // The machine's addresses (VPNs, containers, public IPv6) are told only to its own tabs: the
    // host's create form picks the one to share; anyone else knows the address they came by.
    const all = info();
    const body = JSON.stringify(isLoopback(req.socket.remoteAddress ?? '') ? all : { ...all, urls: [] });
    // Addresses change (Wi-Fi, DHCP): never cached.
    res.writeHead(200, {
      'content-type': 'application/json; charset=utf-8',
      'cache-control': 'no-store',
      'content-length': Buffer.byteLength(body),
    });
    res.end(req.method === 'HEAD' ? undefined : body);
    return true;
  };
}

/**
 * The server could not start: a port in use, one it may not bind, an address that is not this
 * machine's, a certificate or key it cannot use. The message says what to do; `npm start` prints it alone.
 */
export class ServerStartError extends Error {
  override name = 'ServerStartError';
  constructor(
    message: string,
    /** The system's code (EADDRINUSE, EACCES, EADDRNOTAVAIL, ...) or ERR_TLS_* for a bad certificate or key. */
    readonly code: string,
    readonly port?: number,
    readonly host?: string,
  ) {
    super(message);
  }
}

/**
 * Turns `listen`'s error into a `ServerStartError` that says what to do. `free`: a port found free
 * on that host just now (`freePortAfter`), suggested for a port in use; without one, the next port.
 */
export function listenError(err: unknown, host: string, port: number, free?: number): Error {
  const code = typeof err === 'object' && err !== null && 'code' in err && typeof err.code === 'string' ? err.code : '';
  const other = port > 0 && port < 65535 ? port + 1 : 8081;
  switch (code) {
    case 'EADDRINUSE':
      return new ServerStartError(
        free === undefined
          ? `port ${port} is already in use (another npm start?): stop it or choose another with PORT=${other} npm start`
          : `port ${port} is already in use (another npm start?): stop it or choose another with PORT=${free} npm start (${free} was free just now)`,
        code,
        port,
        host,
      );
    case 'EACCES':
      return new ServerStartError(
        `not allowed to listen on port ${port}${port < 1024 ? ' (ports below 1024 need administrator rights)' : ''}: choose another with PORT=${port < 1024 ? 8080 : other} npm start`,
        code,
        port,
        host,
      );
    case 'EADDRNOTAVAIL':
      return new ServerStartError(
        `${host} is not an address of this machine: choose one with HOST=127.0.0.1 (this machine only) or HOST=0.0.0.0 (every network) npm start`,
        code,
        port,
        host,
      );
    default:
      return err instanceof Error ? err : new Error(String(err));
  }
}

/**
 * The first of the `tries` ports after `port` that `host` lets this process listen on now (each
 * is opened and closed again), or undefined: the port suggested when `port` is in use, so that
 * the suggestion is not taken too (a second server already on the next port).
 */
export async function freePortAfter(host: string, port: number, tries = 20): Promise<number | undefined> {
  for (let p = port + 1; p <= Math.min(65535, port + tries); p++) {
    const ok = await new Promise<boolean>((done) => {
      const probe = createNetServer();
      probe.once('error', () => done(false));
      probe.listen(p, host, () => probe.close(() => done(true)));
    });
    if (ok) return p;
  }
  return undefined;
}

/**
 * What `npm start` prints once listening: where to open the page, where other machines can
 * (or that HOST=0.0.0.0 lets them), and a ready session link.
 */
export function startupLines(
  server: { url: string; urls: readonly string[]; host: string; adminSecret?: string },
  demoLink: string,
): string[] {
  const lines = [`Serving on ${server.url}`];
  if (server.urls.length > 0) {
    lines.push('Other machines on your network can open:', ...server.urls.map((u) => `  ${u}`));
    // Sessions are created by the host only: on this machine, or with the admin secret.
    if (server.adminSecret)
      lines.push(
        `Sessions are created on this machine's tabs; from another computer, open ${server.urls[0]}#admin=${server.adminSecret} (keep it private: it lets that tab create sessions)`,
      );
  } else if (WILDCARD.has(server.host)) {
    lines.push('Listening on every interface, but this machine has no network address yet: other machines cannot reach it.');
  } else {
    lines.push(
      `Only this machine can open it (it listens on ${server.host}): for other machines on your network, start with HOST=0.0.0.0 npm start`,
    );
  }
  lines.push(
    `Open ${server.url} to create a session, or open this link in two or three tabs to watch them train a short demo together: ${demoLink}`,
  );
  return lines;
}
