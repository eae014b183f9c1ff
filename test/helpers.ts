/** Shared test helpers: a real server on a free port, real clients. */
import { startServer, type RunningServer, type ServerOptions } from '../signaling/server.ts';
import { StoreClient } from '../src/store.ts';
import { newSessionToken } from '../src/session_token.ts';
import { keptCertificate, type KeptCertificate } from '../signaling/tls.ts';
import { mkdtempSync } from 'node:fs';
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
