/**
 * What the server says about where it can be reached (`GET /api/info`): the page URLs other
 * machines can open, so a share link made on the host's own tab (opened as 127.0.0.1) works on
 * the class's computers. An older server has no such endpoint: callers then use the page's own
 * address.
 */

export interface ServerInfo {
  /** Page URLs other machines can open (e.g. "http://192.168.1.5:8080/"); empty when the server listens on loopback only. */
  urls: string[];
  /** The server itself serves https. */
  secure: boolean;
  /** The address it listens on, e.g. "127.0.0.1:8080". */
  listening: string;
  /** Under https: the certificate's SHA-256 fingerprint, and whether it is self-signed (other browsers warn until they trust it). */
  certificate?: { fingerprint256: string; selfSigned: boolean };
  /** Whether the host offers its own model and data (model and dataset "user"); absent from an older server. */
  offers?: { model: boolean; data: boolean };
}

/** Checks the answer's shape: a page must not build links from whatever a proxy returned. */
export function parseServerInfo(body: unknown): ServerInfo | null {
  if (typeof body !== 'object' || body === null) return null;
  const b = body as Record<string, unknown>;
  if (!Array.isArray(b.urls) || typeof b.secure !== 'boolean' || typeof b.listening !== 'string') return null;
  const urls = b.urls.filter((u): u is string => typeof u === 'string' && /^https?:\/\//.test(u) && URL.canParse(u));
  const c = b.certificate as Record<string, unknown> | undefined;
  // Shown to people as the thing to compare: only a well-formed fingerprint is.
  const certificate =
    typeof c === 'object' &&
    c !== null &&
    typeof c.fingerprint256 === 'string' &&
    /^([0-9A-F]{2}:){31}[0-9A-F]{2}$/.test(c.fingerprint256) &&
    typeof c.selfSigned === 'boolean'
      ? { fingerprint256: c.fingerprint256, selfSigned: c.selfSigned }
      : undefined;
  const o = b.offers as Record<string, unknown> | undefined;
  const offers =
    typeof o === 'object' && o !== null && typeof o.model === 'boolean' && typeof o.data === 'boolean'
      ? { model: o.model, data: o.data }
      : undefined;
  return { urls, secure: b.secure, listening: b.listening, ...(certificate ? { certificate } : {}), ...(offers ? { offers } : {}) };
}

/** The server's info, or null when it has none to give (404, an old server, a timeout). */
export async function fetchServerInfo(timeoutMs = 3000): Promise<ServerInfo | null> {
  try {
    const res = await fetch('/api/info', { signal: AbortSignal.timeout(timeoutMs), headers: { accept: 'application/json' } });
    if (!res.ok) return null;
    return parseServerInfo(await res.json());
  } catch {
    return null;
  }
}

/** 127.0.0.1, ::1 or localhost: an address only this machine can open. */
export function isLoopbackHost(hostname: string): boolean {
  const h = hostname.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h.endsWith('.localhost') || h === '::1' || /^127\./.test(h);
}
