/** Shared test helpers: a real server on a free port, real clients. */
import { startServer, type RunningServer, type ServerOptions } from '../signaling/server.ts';
import { StoreClient } from '../src/store.ts';
import { newSessionToken } from '../src/session_token.ts';

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

export function connect(server: RunningServer, session: string, timeoutMs = 5_000): Promise<StoreClient> {
  return StoreClient.connect(server.url, { session, token: tokenFor(session), timeoutMs });
}

export const text = (b: Uint8Array) => new TextDecoder().decode(b);
