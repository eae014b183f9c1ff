/** `npm start [-- --https]`: build the page if needed, then serve it and the store on one port. */
import { ensureBuilt } from './build.ts';
import { ServerStartError, startServer, type RunningServer } from './server.ts';
import { startupLines } from './network.ts';
import { tlsFromEnv, trustLines } from './tls.ts';
import { newSessionToken } from '../src/c10d/session_token.ts';
import { DEMO_PRESET, sessionUrl } from '../client/ui/session_link.ts';

const args = process.argv.slice(2);
const unknown = args.filter((a) => a !== '--https');
if (unknown.length > 0) {
  console.error(`unknown option ${unknown.join(' ')}: npm start takes only --https (serve https with a self-signed or TLS_CERT/TLS_KEY certificate); PORT and HOST are set in the environment`);
  process.exit(2);
}

let server: RunningServer;
let tls: Awaited<ReturnType<typeof tlsFromEnv>>;
try {
  // Before the build: a bad certificate or key should not wait for it.
  tls = await tlsFromEnv(args.includes('--https'));
  await ensureBuilt();
  server = await startServer(tls ? { tls } : {});
} catch (err) {
  // A taken port, a bad HOST or certificate is the user's to fix: the message says how; a stack would bury it.
  if (!(err instanceof ServerStartError)) throw err;
  console.error(err.message);
  process.exit(1);
}
// A ready session link; its #token=... is the session's secret: whoever has the link can join.
const demoSession = `demo-${newSessionToken().slice(0, 6)}`;
const demoToken = newSessionToken();
// Created now, so that the link works from any tab that opens it first.
await server.createSession(demoSession, demoToken);
// The create form's Quick demo: three tabs train a short run together (it starts once two joined).
const demo = sessionUrl(server.url, { ...DEMO_PRESET, session: demoSession }, demoToken);
for (const line of startupLines(server, demo)) console.log(line);
if (tls) for (const line of trustLines(tls)) console.log(line);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    void server.close().then(() => process.exit(0));
  });
}
