/**
 * `npm run bench:relay-latency`: what a relayed socket costs (signaling/relay.ts). One client of a
 * session straight to the server that owns it, another of the same session to a second server,
 * which relays its socket to the owner over Redis pub/sub; one client of one in-memory server for
 * reference. Each does --rounds sequential round trips of a store `set` and of a `get` of a key
 * that exists (so neither waits), the paths interleaved round by round so that the machine's
 * load falls on all alike. Reports p50/p99 per path and operation, and writes bench/results/relay_latency.{md,json}.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { PROJECT_ROOT } from '../signaling/package_root.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { freePort, startEngine } from '../scripts/cluster_engines.ts';
import { startClusterServer } from '../scripts/cluster.ts';
import { startServerProcess } from './server_process.ts';

const { values } = parseArgs({ options: { rounds: { type: 'string', default: '2000' }, warmup: { type: 'string', default: '200' } } });
const ROUNDS = Number(values.rounds);
const WARMUP = Number(values.warmup);
if (!Number.isInteger(ROUNDS) || ROUNDS < 10) throw new Error(`--rounds ${values.rounds}: give a whole number of 10 or more`);
if (!Number.isInteger(WARMUP) || WARMUP < 0) throw new Error(`--warmup ${values.warmup}: give a whole number of 0 or more`);

const percentile = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))] ?? 0;
const round = (x: number, d = 3) => Math.round(x * 10 ** d) / 10 ** d;

const engine = await startEngine('redis');
const owner = await startClusterServer(await freePort(), engine.url);
const edge = await startClusterServer(await freePort(), engine.url);
const memory = await startServerProcess({ sockets: 16, sessions: 4 });
const stopAll = async () => {
  for (const s of [owner, edge]) s.process.kill('SIGTERM');
  memory.stop();
  await engine.stop();
};

try {
  const session = `relay-${newSessionToken().slice(0, 8)}`;
  const token = newSessionToken();
  // The first socket makes its server the session's owner; the second server relays to it.
  const direct = await StoreClient.connect(owner.url, { session, token });
  const relayed = await StoreClient.connect(edge.url, { session, token });
  const alone = await StoreClient.connect(memory.url, { session, token });
  // A group of the two, formed by the owner (its log says so, the relaying server's does not): the relay is what is measured.
  await Promise.all([direct.rendezvous({ min: 2, max: 2 }), relayed.rendezvous({ min: 2, max: 2 })]);
  const holds = (s: typeof owner) => s.log.some((l) => l.includes(`session "${session}": round`));
  for (const deadline = Date.now() + 10_000; !holds(owner) && Date.now() < deadline; ) await new Promise((r) => setTimeout(r, 50));
  if (!holds(owner) || holds(edge))
    throw new Error(`session "${session}" is not held by the first server alone: no relayed path to measure`);
  const paths = { 'one server, in memory': alone, 'owner server (Redis)': direct, 'relayed through a second server': relayed };
  const times: Record<string, { set: number[]; get: number[] }> = {};
  for (const name of Object.keys(paths)) times[name] = { set: [], get: [] };
  const value = JSON.stringify({ step: 1, loss: 0.5, at: Date.now() });
  for (const [name, c] of Object.entries(paths)) await c.set(`k/${name}`, value);
  for (let i = 0; i < WARMUP + ROUNDS; i++) {
    for (const [name, c] of Object.entries(paths)) {
      const t0 = performance.now();
      await c.set(`k/${name}`, value);
      const t1 = performance.now();
      await c.get(`k/${name}`, 5_000);
      const t2 = performance.now();
      if (i >= WARMUP) {
        times[name]!.set.push(t1 - t0);
        times[name]!.get.push(t2 - t1);
      }
    }
  }
  for (const c of Object.values(paths)) c.close();

  const rows = Object.entries(times).map(([path, t]) => ({
    path,
    setP50: round(percentile(t.set, 50)),
    setP99: round(percentile(t.set, 99)),
    getP50: round(percentile(t.get, 50)),
    getP99: round(percentile(t.get, 99)),
  }));
  const date = new Date().toISOString().slice(0, 10);
  const load = loadavg()[0]!.toFixed(1);
  const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), load average ${load} at the end; client, servers and Redis all on it`;
  const lines = [
    `Relayed socket latency, ${date}, ${machine}: ${ROUNDS} sequential round trips of each operation per path (after ${WARMUP} to warm up), paths interleaved.`,
    '',
    '| path | set p50 ms | set p99 ms | get p50 ms | get p99 ms |',
    '| --- | ---: | ---: | ---: | ---: |',
    ...rows.map((r) => `| ${r.path} | ${r.setP50} | ${r.setP99} | ${r.getP50} | ${r.getP99} |`),
    '',
    `\`npm run bench:relay-latency\` (\`npx tsx bench/relay_latency.ts --rounds ${ROUNDS}\`).`,
  ];
  console.log(lines.join('\n'));
  const dir = join(PROJECT_ROOT, 'bench', 'results');
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'relay_latency.json'), `${JSON.stringify({ date, machine, rounds: ROUNDS, warmup: WARMUP, rows }, null, 2)}\n`);
  await writeFile(join(dir, 'relay_latency.md'), `${lines.join('\n')}\n`);
} finally {
  await stopAll();
}
process.exit(0);
