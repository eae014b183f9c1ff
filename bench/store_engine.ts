/**
 * `npm run bench:store-engine`: the store's typical operations on the engines a shared store could
 * run on, against today's in-memory store. Each engine is started here (its own loopback port,
 * data in a temporary folder, stopped at the end, also on failure): Redis through the server's
 * own engine store (signaling/engine_store.ts: Lua scripts for writes and compare-and-set, pub/sub
 * for waits) and etcd through etcd3 (puts, transactions for compare-and-set and counters,
 * watches for waits), torch's EtcdStore way. The in-memory store is signaling/store.ts called in
 * this process (no socket): the floor the others add a network hop and an engine to.
 *
 * The workload is a rendezvous round's pattern, --sessions sessions of 8 ranks at once, --rounds
 * rounds: each rank adds to the round's counter, sets its status, takes the round's leader place
 * with compareSet, waits for every rank's status, then gets the leader. Reported per backend:
 * operations per second, p50/p99 per operation, CPU per operation of this process (the server's
 * part: the store layer and the engine's client) and of the engine, and memory per session (the
 * engine's resident set, or this process's heap, after --fill sessions of a round's keys).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Etcd3 } from 'etcd3';
import { parseStoreUrl, RedisEngine } from '../signaling/engine_store.ts';
import { PROJECT_ROOT } from '../signaling/package_root.ts';
import { KeyValueStore } from '../signaling/store.ts';
import { processUsage, startEngine, type EngineKind, type EngineProcess } from '../scripts/cluster_engines.ts';

const { values } = parseArgs({
  options: {
    sessions: { type: 'string', default: '50' },
    rounds: { type: 'string', default: '20' },
    fill: { type: 'string', default: '1000' },
    engines: { type: 'string', default: 'memory,redis,etcd' },
    out: { type: 'string', default: 'store_engine' },
  },
});
const SESSIONS = Number(values.sessions);
const ROUNDS = Number(values.rounds);
const FILL = Number(values.fill);
const RANKS = 8;
const TIMEOUT_MS = 30_000;

/** One session's store as the bench drives it. */
interface BenchStore {
  set(key: string, value: Buffer): Promise<void>;
  get(key: string): Promise<Uint8Array>;
  add(key: string, amount: number): Promise<number>;
  compareSet(key: string, expected: Buffer, desired: Buffer): Promise<Uint8Array>;
  wait(keys: string[]): Promise<void>;
}

interface Backend {
  name: string;
  engine?: EngineProcess;
  session(name: string): BenchStore;
  close(): Promise<void>;
}

const QUOTA = { maxKeys: 10_000, maxBytes: 64 * 2 ** 20 };
const owner = {};

function memoryBackend(): Backend {
  const stores = new Map<string, KeyValueStore>();
  return {
    name: 'in-memory (signaling/store.ts, no socket)',
    session(name) {
      const s = new KeyValueStore(QUOTA);
      stores.set(name, s);
      return {
        set: async (k, v) => s.set(k, v),
        get: (k) => s.get(k, TIMEOUT_MS, owner),
        add: async (k, a) => s.add(k, a),
        compareSet: async (k, e, d) => s.compareSet(k, e, d),
        wait: (keys) => s.wait(keys, TIMEOUT_MS, owner),
      };
    },
    close: async () => {
      for (const s of stores.values()) s.close();
    },
  };
}

async function redisBackend(engine: EngineProcess): Promise<Backend> {
  const redis = new RedisEngine(parseStoreUrl(engine.url), 3_600_000);
  await redis.connect();
  return {
    name: 'Redis 7 (engine_store.ts: Lua, pub/sub)',
    engine,
    session(name) {
      const s = redis.open(name, QUOTA);
      return {
        set: (k, v) => s.set(k, v),
        get: async (k) => (await s.getNow([k]))?.[0] ?? s.get(k, TIMEOUT_MS, owner),
        add: (k, a) => s.add(k, a),
        compareSet: (k, e, d) => s.compareSet(k, e, d),
        wait: async (keys) => {
          if (!(await s.check(keys))) await s.wait(keys, TIMEOUT_MS, owner);
        },
      };
    },
    close: async () => redis.close(),
  };
}

async function etcdBackend(engine: EngineProcess): Promise<Backend> {
  const client = new Etcd3({ hosts: `http://127.0.0.1:${engine.port}` });
  return {
    name: 'etcd 3.4 (etcd3: txn, watch)',
    engine,
    session(name) {
      const ns = client.namespace(`ddp/${name}/`);
      const get = async (k: string) => {
        const now = await ns.get(k).buffer();
        if (now) return new Uint8Array(now);
        await waitKeys([k]);
        return new Uint8Array((await ns.get(k).buffer())!);
      };
      // Watch first, then read: a put between the two is read, one after it is heard (as the Redis store does).
      const waitKeys = async (keys: string[]) => {
        const missing = new Set(keys);
        const watchers = await Promise.all(keys.map((k) => ns.watch().key(k).create()));
        const done = new Promise<void>((resolve) => {
          for (const [i, w] of watchers.entries())
            w.on('put', () => {
              missing.delete(keys[i]!);
              if (missing.size === 0) resolve();
            });
        });
        const found = await Promise.all(keys.map((k) => ns.get(k).buffer()));
        for (const [i, v] of found.entries()) if (v) missing.delete(keys[i]!);
        if (missing.size > 0) await done;
        await Promise.all(watchers.map((w) => w.cancel()));
      };
      return {
        set: async (k, v) => {
          await ns.put(k).value(v);
        },
        get,
        add: async (k, amount) => {
          // Optimistic: read with its revision, write if nobody wrote since (etcd has no increment).
          for (;;) {
            const r = await ns.get(k).exec();
            const kv = r.kvs[0];
            const next = (kv ? Number(kv.value.toString()) : 0) + amount;
            const t = await ns
              .if(k, 'Mod', '==', kv ? Number(kv.mod_revision) : 0)
              .then(ns.put(k).value(String(next)))
              .commit();
            if (t.succeeded) return next;
          }
        },
        compareSet: async (k, expected, desired) => {
          const cmp = expected.length === 0 ? ns.if(k, 'Create', '==', 0) : ns.if(k, 'Value', '==', expected);
          const t = await cmp.then(ns.put(k).value(desired)).else(ns.get(k)).commit();
          if (t.succeeded) return new Uint8Array(desired);
          const current = t.responses[0]?.response_range?.kvs[0]?.value;
          return new Uint8Array(current ?? expected);
        },
        wait: waitKeys,
      };
    },
    close: async () => client.close(),
  };
}

const percentile = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? 0;
};
const round = (x: number, d = 2) => Math.round(x * 10 ** d) / 10 ** d;

type Op = 'add' | 'set' | 'compareSet' | 'wait' | 'get';

/** The rounds of every session at once; latencies per operation. */
async function workload(backend: Backend, tag: string): Promise<{ latencies: Record<Op, number[]>; ops: number; sec: number }> {
  const latencies: Record<Op, number[]> = { add: [], set: [], compareSet: [], wait: [], get: [] };
  let ops = 0;
  const timed = async <T>(op: Op, call: () => Promise<T>) => {
    const t = performance.now();
    const r = await call();
    latencies[op].push(performance.now() - t);
    ops++;
    return r;
  };
  const status = Buffer.from(JSON.stringify({ step: 1, loss: 0.5, samplesPerSec: 1000, backend: 'webgpu', at: Date.now() }));
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: SESSIONS }, async (_, si) => {
      const s = backend.session(`${tag}-${si}`);
      for (let r = 0; r < ROUNDS; r++) {
        await Promise.all(
          Array.from({ length: RANKS }, async (_, rank) => {
            await timed('add', () => s.add(`round/${r}/arrived`, 1));
            await timed('set', () => s.set(`round/${r}/status/${rank}`, status));
            await timed('compareSet', () => s.compareSet(`round/${r}/leader`, Buffer.alloc(0), Buffer.from(String(rank))));
            await timed('wait', () => s.wait(Array.from({ length: RANKS }, (_, i) => `round/${r}/status/${i}`)));
            await timed('get', () => s.get(`round/${r}/leader`));
          }),
        );
      }
    }),
  );
  return { latencies, ops, sec: (performance.now() - t0) / 1000 };
}

/** Bytes per session of a round's keys: the engine's resident set, or this process's heap, grown by --fill sessions. */
async function memoryPerSession(backend: Backend): Promise<number> {
  const gc = (globalThis as { gc?: () => void }).gc;
  const measure = () => {
    gc?.();
    return backend.engine ? processUsage(backend.engine.pid).rssBytes : process.memoryUsage().heapUsed;
  };
  const before = measure();
  const status = Buffer.from(JSON.stringify({ step: 1, loss: 0.5, samplesPerSec: 1000, backend: 'webgpu', at: Date.now() }));
  for (let i = 0; i < FILL; i += 100) {
    await Promise.all(
      Array.from({ length: Math.min(100, FILL - i) }, async (_, j) => {
        const s = backend.session(`fill-${i + j}`);
        await Promise.all(Array.from({ length: RANKS }, (_, rank) => s.set(`status/${rank}`, status)));
        await s.add('arrived', RANKS);
        await s.compareSet('leader', Buffer.alloc(0), Buffer.from('0'));
      }),
    );
  }
  return (measure() - before) / FILL;
}

async function measure(kind: 'memory' | EngineKind) {
  const engine = kind === 'memory' ? undefined : await startEngine(kind);
  try {
    const backend = kind === 'memory' ? memoryBackend() : kind === 'redis' ? await redisBackend(engine!) : await etcdBackend(engine!);
    try {
      await workload(backend, 'warm');
      const cpu0 = process.cpuUsage();
      const engine0 = engine ? processUsage(engine.pid).cpuSec : 0;
      const run = await workload(backend, 'run');
      const cpu = process.cpuUsage(cpu0);
      const engineSec = engine ? processUsage(engine.pid).cpuSec - engine0 : 0;
      const bytes = await memoryPerSession(backend);
      return {
        backend: backend.name,
        opsPerSec: round(run.ops / run.sec, 0),
        serverCpuUsPerOp: round((cpu.user + cpu.system) / run.ops, 1),
        engineCpuUsPerOp: round((engineSec * 1e6) / run.ops, 1),
        kiBPerSession: round(bytes / 1024, 1),
        latencyMs: Object.fromEntries(
          Object.entries(run.latencies).map(([k, xs]) => [k, { p50: round(percentile(xs, 50)), p99: round(percentile(xs, 99)) }]),
        ),
      };
    } finally {
      await backend.close();
    }
  } finally {
    await engine?.stop();
  }
}

const results = [];
for (const kind of values.engines.split(',') as Array<'memory' | EngineKind>) {
  console.log(`measuring ${kind} ...`);
  results.push(await measure(kind));
}
const date = new Date().toISOString().slice(0, 10);
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), bench, store layer and engine on one machine`;
const ops: Op[] = ['add', 'set', 'compareSet', 'wait', 'get'];
const lines = [
  `Store engines, ${date}, ${machine}: ${SESSIONS} sessions x ${RANKS} ranks at once, ${ROUNDS} rounds of add, set, compareSet, wait (8 keys), get each; memory after ${FILL} sessions of a round's keys.`,
  '',
  `| backend | ops/s | this process µs/op | engine µs/op | KiB/session | ${ops.map((o) => `${o} p50/p99 ms`).join(' | ')} |`,
  `| --- | ---: | ---: | ---: | ---: | ${ops.map(() => '---:').join(' | ')} |`,
  ...results.map(
    (r) =>
      `| ${r.backend} | ${r.opsPerSec} | ${r.serverCpuUsPerOp} | ${r.engineCpuUsPerOp} | ${r.kiBPerSession} | ${ops.map((o) => `${r.latencyMs[o]!.p50} / ${r.latencyMs[o]!.p99}`).join(' | ')} |`,
  ),
];
console.log(lines.join('\n'));
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(
  join(dir, `${values.out}.json`),
  `${JSON.stringify({ date, machine, sessions: SESSIONS, rounds: ROUNDS, fill: FILL, results }, null, 2)}\n`,
);
await writeFile(join(dir, `${values.out}.md`), `${lines.join('\n')}\n`);
process.exit(0);
