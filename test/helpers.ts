/** Shared test helpers: a real server on a free port, real clients. */
import { startServer, type RunningServer, type ServerOptions } from '../signaling/server.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { newSessionToken } from '../src/c10d/session_token.ts';
import { keptCertificate, type KeptCertificate } from '../signaling/tls.ts';
import { findTurnserver } from '../launcher/turn.ts';
import { mkdtempSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export async function withServer(options: ServerOptions = {}): Promise<RunningServer> {
  return startServer({ port: 0, log: () => {}, ...options });
}

let sessionCounter = 0;
export function uniqueSession(prefix = 't'): string {
  return `${prefix}-${process.pid}-${++sessionCounter}`;
}

const tokens = new Map<string, string>();
/** The token of a test session: one per session name, made on first use. */
export function tokenFor(session: string): string {
  let token = tokens.get(session);
  if (token === undefined) tokens.set(session, (token = newSessionToken()));
  return token;
}

let certificate: Promise<KeptCertificate> | undefined;
/** One self-signed certificate for this machine per test process, kept in a temporary folder (not certs/). */
export function testCertificate(): Promise<KeptCertificate> {
  certificate ??= keptCertificate({ dir: mkdtempSync(join(tmpdir(), 'ddp-test-certs-')) });
  return certificate;
}

/** A store client for `server`; over wss it trusts the test certificate (the one `testCertificate()` gives). */
export async function connect(server: RunningServer, session: string, timeoutMs = 5_000): Promise<StoreClient> {
  const ca = server.secure ? (await testCertificate()).cert : undefined;
  return StoreClient.connect(server.url, { session, token: tokenFor(session), timeoutMs, ...(ca ? { ca } : {}) });
}

export const text = (b: Uint8Array) => new TextDecoder().decode(b);

/**
 * One HTTP(S) request with headers fetch may not set (Host, Origin), trusting `ca` over https.
 * Resolves with the status and the body as text.
 */
export function rawRequest(url: string, o: { headers?: Record<string, string>; method?: string; ca?: string } = {}): Promise<{ status: number; body: string }> {
  const send = url.startsWith('https:') ? httpsRequest : httpRequest;
  return new Promise((resolve, reject) => {
    const req = send(url, { method: o.method ?? 'GET', headers: o.headers ?? {}, ...(o.ca ? { ca: o.ca } : {}) }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * Why the tests that build network namespaces (root) or start coturn cannot run on this
 * machine, or undefined when they can. On a developer's machine without root or coturn they
 * skip with that reason; `.ci/run` sets DDP_REQUIRE_ALL_TESTS=1, and there a missing need fails
 * the run instead, so CI can never turn green by skipping them.
 */
export function lanTestsBlocked(needs: { root: boolean; coturn: boolean }): string | undefined {
  const missing: string[] = [];
  if (needs.root && process.getuid?.() !== 0) missing.push('root (network namespaces)');
  if (needs.coturn && !hasTurnserver()) missing.push("coturn's turnserver (apt-get install -y coturn)");
  if (missing.length === 0) return undefined;
  const reason = `needs ${missing.join(' and ')}`;
  if (process.env.DDP_REQUIRE_ALL_TESTS) throw new Error(`${reason}, and DDP_REQUIRE_ALL_TESTS is set: CI must run these tests, not skip them`);
  return reason;
}

function hasTurnserver(): boolean {
  try {
    findTurnserver();
    return true;
  } catch {
    return false;
  }
}

/** ||a - b|| / ||b||, the relative error of `a` against `b`; throws when their lengths differ. */
export function relativeError(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) throw new Error(`cannot compare ${a.length} values with ${b.length}`);
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < a.length; i++) {
    diff += (a[i]! - b[i]!) ** 2;
    norm += b[i]! ** 2;
  }
  return Math.sqrt(diff / norm);
}
