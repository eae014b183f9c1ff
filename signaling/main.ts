/** `npm start`: build the page if needed, then serve it and the store on one port. */
import { ensureBuilt } from './build.ts';
import { startServer } from './server.ts';
import { newSessionToken, withToken } from '../src/session_token.ts';

await ensureBuilt();
const server = await startServer();
console.log(`Serving on ${server.url}`);
// A ready session link; its #token=... is the session's secret: whoever has the link can join.
const demo = withToken(`${server.url}?session=demo-${newSessionToken().slice(0, 6)}&world=3`, newSessionToken());
console.log(`Open ${server.url} to create a session, or open this link in three tabs: ${demo}`);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    void server.close().then(() => process.exit(0));
  });
}
