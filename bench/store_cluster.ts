/**
 * `npm run bench:store-cluster`: the store load bench's workload (bench/store_load.ts: --sessions
 * sessions of --ranks clients join their groups at once, then --steps steps of a run's store
 * traffic: each rank sets its status and counts the step, rank 0 reads every status) against one
 * in-memory server, and against 1, 2 and 4 servers on one Redis behind HAProxy
 * (scripts/cluster.ts), one after another in one run. Reports per setup: the rendezvous' wall
 * time, operations per second, p50/p99, and CPU per operation of the servers, Redis and the
 * proxy; and each setup's ratio to the in-memory server. Everything (clients, servers, Redis,
 * proxy) shares this machine's cores: the ratios say what the shared store costs here, not what
 * more machines would gain.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { PROJECT_ROOT } from '../signaling/package_root.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { processUsage } from '../scripts/cluster_engines.ts';
import { startCluster } from '../scripts/cluster.ts';
import { startServerProcess } from './server_process.ts';

const { values } = parseArgs({
  options: {
    sessions: { type: 'string', default: '50' },
    ranks: { type: 'string', default: '8' },
    steps: { type: 'string', default: '30' },
    servers: { type: 'string', default: '0,1,2,4' },
  },
});
const SESSIONS = Number(values.sessions);
const RANKS = Number(values.ranks);
const STEPS = Number(values.steps);

interface Setup {
  url: string;
  /** Server pids, then Redis', then the proxy's (absent for one in-memory server). */
  pids: { servers: number[]; engine?: number; proxy?: number };
  stop(): Promise<void>;
}

async function inMemoryServer(): Promise<Setup> {
  const s = await startServerProcess({ sockets: SESSIONS * RANKS, sessions: SESSIONS });
  return { url: s.url, pids: { servers: [s.pid] }, stop: async () => s.stop() };
}

async function clusterOf(n: number): Promise<Setup> {
  const c = await startCluster({ servers: n });
  return { url: c.url, pids: { servers: c.servers.map((s) => s.process.pid!), engine: c.engine.pid, proxy: c.proxy.pid! }, stop: c.stop };
}

const cpuOf = (pids: number[]) => pids.reduce((sum, pid) => sum + processUsage(pid).cpuSec, 0);
const percentile = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))] ?? 0;
const round = (x: number, d = 2) => Math.round(x * 10 ** d) / 10 ** d;

async function measure(setup: Setup) {
  const t0 = performance.now();
  const groups: ProcessGroup[][] = await Promise.all(
    Array.from({ length: SESSIONS }, async (_, s) => {
      const session = `load-${s}-${newSessionToken().slice(0, 6)}`;
      const token = newSessionToken();
      const net = new MemoryNetwork();
      return Promise.all(
        Array.from({ length: RANKS }, (_, rank) =>
          initProcessGroup({
            url: setup.url,
            session,
            token,
            worldSize: RANKS,
            rank,
            timeoutMs: 120_000,
            linkFactory: net.factoryFor(rank),
          }),
        ),
      );
    }),
  );
  const rendezvousSec = (performance.now() - t0) / 1000;
  const latencies: number[] = [];
  const timed = async <T>(call: () => Promise<T>) => {
    const start = performance.now();
    const r = await call();
    latencies.push(performance.now() - start);
    return r;
  };
  const { servers, engine, proxy } = setup.pids;
  const before = { servers: cpuOf(servers), engine: engine ? cpuOf([engine]) : 0, proxy: proxy ? cpuOf([proxy]) : 0 };
  const t1 = performance.now();
  await Promise.all(
    groups.map(async (pgs) => {
      for (let step = 1; step <= STEPS; step++) {
        await Promise.all(
          pgs.map(async (pg) => {
            await timed(() => pg.store.set(`status/${pg.rank}`, JSON.stringify({ step, loss: Math.random(), at: Date.now() })));
            await timed(() => pg.store.add('steps', 1));
          }),
        );
        await timed(() => pgs[0]!.store.multiGet(pgs.map((pg) => `status/${pg.rank}`)));
      }
    }),
  );
  const sec = (performance.now() - t1) / 1000;
  const ops = latencies.length;
  const us = (cpuSec: number) => round((cpuSec * 1e6) / ops, 1);
  const result = {
    rendezvousSec: round(rendezvousSec),
    opsPerSec: round(ops / sec, 0),
    p50: round(percentile(latencies, 50)),
    p99: round(percentile(latencies, 99)),
    serversCpuUsPerOp: us(cpuOf(servers) - before.servers),
    engineCpuUsPerOp: engine ? us(cpuOf([engine]) - before.engine) : 0,
    proxyCpuUsPerOp: proxy ? us(cpuOf([proxy]) - before.proxy) : 0,
  };
  for (const pgs of groups) for (const pg of pgs) pg.destroy(true);
  return result;
}

const rows: Array<{ setup: string } & Awaited<ReturnType<typeof measure>>> = [];
for (const n of values.servers.split(',').map(Number)) {
  const name = n === 0 ? 'one server, in memory' : `${n} server${n > 1 ? 's' : ''} on Redis, HAProxy in front`;
  console.log(`measuring ${name} ...`);
  const setup = n === 0 ? await inMemoryServer() : await clusterOf(n);
  try {
    rows.push({ setup: name, ...(await measure(setup)) });
  } finally {
    await setup.stop();
  }
}
const base = rows[0]!;
const date = new Date().toISOString().slice(0, 10);
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}); clients, servers, Redis and HAProxy all on it`;
const lines = [
  `Store load across servers, ${date}, ${machine}: ${SESSIONS} sessions x ${RANKS} ranks joined at once, then ${STEPS} steps of store traffic (set, add per rank, multiGet by rank 0). Ratios to the first row.`,
  '',
  '| setup | rendezvous s | ops/s (ratio) | p50 ms | p99 ms (ratio) | servers µs/op | Redis µs/op | HAProxy µs/op |',
  '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
  ...rows.map(
    (r) =>
      `| ${r.setup} | ${r.rendezvousSec} | ${r.opsPerSec} (${round(r.opsPerSec / base.opsPerSec)}) | ${r.p50} | ${r.p99} (${round(r.p99 / base.p99)}) | ${r.serversCpuUsPerOp} | ${r.engineCpuUsPerOp} | ${r.proxyCpuUsPerOp} |`,
  ),
];
console.log(lines.join('\n'));
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(
  join(dir, 'store_cluster.json'),
  `${JSON.stringify({ date, machine, sessions: SESSIONS, ranks: RANKS, steps: STEPS, rows }, null, 2)}\n`,
);
await writeFile(join(dir, 'store_cluster.md'), `${lines.join('\n')}\n`);
process.exit(0);
