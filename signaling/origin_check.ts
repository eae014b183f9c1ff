/**
 * Which requests come from this server's own pages (what Jupyter checks before its token):
 * - `Host` must name this server (localhost, 127.0.0.1, [::1], the address it listens on, the
 *   machine's own addresses when it listens on all of them, or a configured name), so that a
 *   foreign name resolved to this machine by DNS rebinding reaches nothing;
 * - `Origin`, when a browser sends one, must be this server's own (the same host and port the
 *   request was sent to) or a configured one, so that another site's page open in the same
 *   browser cannot use the store, the signaling relay or the checkpoint routes. A server
 *   serving https takes only https origins: a page of the same host and port over plain http
 *   is not its own.
 * Requests without `Origin` (Node clients, the launcher, same-origin page loads) pass.
 */
import type { IncomingMessage } from 'node:http';
import { hostname, networkInterfaces } from 'node:os';

export interface OriginPolicyOptions {
  /** The interface the server listens on (HOST). */
  listenHost: string;
  /** More host names this server answers to (a DNS name, a reverse proxy's name). */
  allowedHosts?: readonly string[];
  /** More origins whose pages may use the server (e.g. `https://ddp.example.org` behind a proxy). */
  allowedOrigins?: readonly string[];
  /** The server serves https (its own pages' origins are https://). */
  secure?: boolean;
}

export type Verdict = { ok: true } | { ok: false; status: 403; message: string };

const WILDCARD = new Set(['0.0.0.0', '::', '']);

export class OriginPolicy {
  private readonly hosts: Set<string>;
  private readonly origins: Set<string>;
  /**
   * The scheme of this server's own pages. A plain-http server also takes https origins of its
   * own host and port: a TLS reverse proxy in front of it keeps the Host header.
   */
  private readonly schemes: ReadonlySet<string>;

  constructor(options: OriginPolicyOptions) {
    this.schemes = new Set(options.secure ? ['https:'] : ['http:', 'https:']);
    const hosts = ['localhost', '127.0.0.1', '::1', ...(options.allowedHosts ?? [])];
    if (WILDCARD.has(options.listenHost)) {
      // Listening on every interface: other machines reach it by any of this machine's addresses or its name.
      hosts.push(hostname(), `${hostname()}.local`);
      for (const addresses of Object.values(networkInterfaces())) for (const a of addresses ?? []) hosts.push(a.address);
    } else {
      hosts.push(options.listenHost);
    }
    this.hosts = new Set(hosts.map(normalizeHost));
    this.origins = new Set((options.allowedOrigins ?? []).map((o) => new URL(o).origin));
  }

  /** Whether `req` may be answered: its Host names this server, and its Origin (if any) is this server's or allowed. */
  check(req: IncomingMessage): Verdict {
    const host = req.headers.host;
    const hostName = host === undefined ? undefined : hostOf(host);
    if (hostName === undefined || !this.hosts.has(hostName)) {
      return {
        ok: false,
        status: 403,
        message: `this server does not answer to the host name ${JSON.stringify(host ?? '')}: open it by localhost, its IP address, or add the name to ALLOWED_HOSTS (startServer's allowedHosts)`,
      };
    }
    const origin = req.headers.origin;
    if (origin === undefined) return { ok: true };
    let parsed: URL | undefined;
    try {
      parsed = new URL(origin);
    } catch {
      parsed = undefined; // "null" (sandboxed frames, file://) and garbage are foreign
    }
    if (parsed && ((parsed.host === host!.toLowerCase() && this.schemes.has(parsed.protocol)) || this.origins.has(parsed.origin)))
      return { ok: true };
    return {
      ok: false,
      status: 403,
      message: `requests from pages of ${JSON.stringify(origin)} are not allowed: only this server's own pages may use it (add the origin to ALLOWED_ORIGINS, startServer's allowedOrigins, to allow it)`,
    };
  }
}

/** The host name of a Host header ("127.0.0.1:8080", "[::1]:8080", "name"), lowercased, without brackets. */
function hostOf(header: string): string | undefined {
  try {
    return normalizeHost(new URL(`http://${header}`).hostname);
  } catch {
    return undefined;
  }
}

function normalizeHost(h: string): string {
  return h
    .toLowerCase()
    .replace(/^\[(.*)\]$/, '$1')
    .replace(/\.$/, '');
}
