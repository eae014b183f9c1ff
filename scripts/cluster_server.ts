/**
 * One server of a cluster (scripts/cluster.ts), in a process of its own so that it can die alone:
 * `DDP_STORE=redis://... node --import tsx scripts/cluster_server.ts PORT [SETTLE_MS]`. Prints
 * `{"url": ...}` once listening, then the server's log lines. The store URL (with Redis' password)
 * comes in the environment, not on the command line, which other users' `ps` would show.
 */
import { startServer } from '../signaling/server.ts';

const [port, settle] = process.argv.slice(2);
const store = process.env.DDP_STORE;
if (!store) throw new Error('DDP_STORE must name the shared store: redis://:PASSWORD@HOST:PORT');
const server = await startServer({
  port: Number(port),
  host: '127.0.0.1',
  store,
  ...(settle ? { settleMs: Number(settle) } : {}),
  // Behind the proxy every socket comes from the proxy's address: the per-address bound would cap the whole server.
  limits: { maxConnectionsPerAddress: 8_192 },
  log: (line) => console.log(line),
});
console.log(JSON.stringify({ url: server.url }));
for (const signal of ['SIGINT', 'SIGTERM'] as const) process.on(signal, () => void server.close().then(() => process.exit(0)));
