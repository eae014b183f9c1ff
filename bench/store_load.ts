/**
 * `npm run bench:store-load`: many sessions on one server. The server runs in a child process
 * (so its CPU time and memory are its own); this process plays --sessions sessions of --ranks
 * clients each: every client joins its session's group (initProcessGroup: hello, the rendezvous,
 * the group's store keys; in-memory peer links, so no WebRTC signals), then every session runs
 * --steps steps of a run's store traffic: each rank writes its status, counts the step, and rank
 * 0 reads every rank's status (the dashboard's fleet view does as much). Prints and writes
 * bench/results/store_load.md: p50/p99 latency of the store operations, the rendezvous' wall
 * time, the server's memory per session and CPU per message.
 */
import { readFile, mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { PROJECT_ROOT } from '../signaling/server.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { startServerProcess } from './server_process.ts';

const { values } = parseArgs({
  options: {
    sessions: { type: 'string', default: '100' },
    ranks: { type: 'string', default: '8' },
    steps: { type: 'string', default: '50' },
  },
});
const SESSIONS = Number(values.sessions);
const RANKS = Number(values.ranks);
const STEPS = Number(values.steps);

/** The process's CPU seconds (user + system) and resident memory (bytes), from /proc. */
async function usage(pid: number): Promise<{ cpuSec: number; rssBytes: number }> {
  const stat = (await readFile(`/proc/${pid}/stat`, 'utf8')).split(') ')[1]!.split(' ');
  const ticks = Number(stat[11]) + Number(stat[12]);
  const rssPages = Number(stat[21]);
  return { cpuSec: ticks / 100, rssBytes: rssPages * 4096 };
}

const percentile = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? 0;
};

const server = await startServerProcess({ sockets: SESSIONS * RANKS, sessions: SESSIONS });
const idle = await usage(server.pid);
console.log(`server pid ${server.pid} at ${server.url}: ${(idle.rssBytes / 2 ** 20).toFixed(1)} MiB resident before any session`);

// 1. Rendezvous: every session's ranks join at once.
const t0 = performance.now();
const groups: ProcessGroup[][] = await Promise.all(
  Array.from({ length: SESSIONS }, async (_, s) => {
    const session = `load-${s}`;
    const token = newSessionToken();
    const net = new MemoryNetwork();
    return Promise.all(
      Array.from({ length: RANKS }, (_, rank) =>
        initProcessGroup({
          url: server.url,
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
const rendezvousMs = performance.now() - t0;
const afterJoin = await usage(server.pid);
console.log(`${SESSIONS} sessions x ${RANKS} ranks joined in ${(rendezvousMs / 1000).toFixed(1)} s`);

// 2. Per-step store traffic of every session at once.
const latencies: Record<'set' | 'add' | 'multiGet', number[]> = { set: [], add: [], multiGet: [] };
let messages = 0;
const timed = async <T>(kind: keyof typeof latencies, call: () => Promise<T>): Promise<T> => {
  const start = performance.now();
  const result = await call();
  latencies[kind].push(performance.now() - start);
  messages++;
  return result;
};
const before = await usage(server.pid);
const t1 = performance.now();
await Promise.all(
  groups.map(async (pgs) => {
    for (let step = 1; step <= STEPS; step++) {
      await Promise.all(
        pgs.map(async (pg) => {
          const store = pg.store;
          await timed('set', () =>
            store.set(
              `status/${pg.rank}`,
              JSON.stringify({ step, loss: Math.random(), samplesPerSec: 1000, backend: 'webgpu', at: Date.now() }),
            ),
          );
          await timed('add', () => store.add('steps', 1));
        }),
      );
      await timed('multiGet', () => pgs[0]!.store.multiGet(pgs.map((pg) => `status/${pg.rank}`)));
    }
  }),
);
const trafficSec = (performance.now() - t1) / 1000;
const after = await usage(server.pid);
for (const pgs of groups) for (const pg of pgs) pg.destroy(true);
server.stop();

const round = (x: number, d = 2) => Math.round(x * 10 ** d) / 10 ** d;
const result = {
  date: new Date().toISOString().slice(0, 10),
  machine: `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}); server and clients on one machine, the server in its own process`,
  sessions: SESSIONS,
  ranks: RANKS,
  steps: STEPS,
  rendezvousSec: round(rendezvousMs / 1000),
  serverMiBIdle: round(idle.rssBytes / 2 ** 20, 1),
  serverKiBPerSession: round((afterJoin.rssBytes - idle.rssBytes) / 1024 / SESSIONS, 1),
  messages,
  messagesPerSec: round(messages / trafficSec, 0),
  serverCpuUsPerMessage: round(((after.cpuSec - before.cpuSec) * 1e6) / messages, 1),
  latencyMs: Object.fromEntries(
    Object.entries(latencies).map(([k, xs]) => [k, { p50: round(percentile(xs, 50)), p99: round(percentile(xs, 99)) }]),
  ),
};
const lines = [
  `Store load, ${result.date}, ${result.machine}: ${SESSIONS} sessions x ${RANKS} ranks, ${STEPS} steps of store traffic each.`,
  '',
  `- rendezvous of all ${SESSIONS * RANKS} clients at once: ${result.rendezvousSec} s`,
  `- server memory: ${result.serverMiBIdle} MiB idle, +${result.serverKiBPerSession} KiB per session of ${RANKS} (resident set after the joins)`,
  `- traffic: ${messages} store operations in ${round(trafficSec, 1)} s (${result.messagesPerSec}/s), server CPU ${result.serverCpuUsPerMessage} µs per operation`,
  '',
  '| operation | p50 ms | p99 ms |',
  '| --- | ---: | ---: |',
  ...Object.entries(result.latencyMs).map(([k, v]) => `| ${k} | ${v.p50} | ${v.p99} |`),
];
console.log(lines.join('\n'));
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(join(dir, 'store_load.json'), `${JSON.stringify(result, null, 2)}\n`);
await writeFile(join(dir, 'store_load.md'), `${lines.join('\n')}\n`);
process.exit(0);
