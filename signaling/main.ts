/** `npm start`: build the page if needed, then serve it and the store on one port. */
import { ensureBuilt } from './build.ts';
import { ServerStartError, startServer, type RunningServer } from './server.ts';
import { startupLines } from './network.ts';
import { newSessionToken, withToken } from '../src/session_token.ts';

await ensureBuilt();
let server: RunningServer;
try {
  server = await startServer();
} catch (err) {
  // A taken port or a bad HOST is the user's to fix: the message says how; a stack would bury it.
  if (!(err instanceof ServerStartError)) throw err;
  console.error(err.message);
  process.exit(1);
}
// A ready session link; its #token=... is the session's secret: whoever has the link can join.
const demo = withToken(`${server.url}?session=demo-${newSessionToken().slice(0, 6)}&world=3`, newSessionToken());
for (const line of startupLines(server, demo)) console.log(line);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    void server.close().then(() => process.exit(0));
  });
}
