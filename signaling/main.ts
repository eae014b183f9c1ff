/** `npm start`: build the page if needed, then serve it and the store on one port. */
import { ensureBuilt } from './build.ts';
import { startServer } from './server.ts';

await ensureBuilt();
const server = await startServer();
console.log(`Serving on ${server.url}`);
console.log(`Open ${server.url}?session=demo&world=3 in three tabs, or ${server.url} to create a session.`);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    void server.close().then(() => process.exit(0));
  });
}
