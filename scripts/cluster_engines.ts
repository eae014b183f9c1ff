/**
 * The engines a shared store runs on (Debian's redis-server and etcd), started as child processes
 * for a bench, a test or `npm run cluster`: each on a free loopback port of its own, its data in a
 * new temporary folder, Redis with a password of its own and an append-only file there (so that a
 * restart on the same folder keeps the sessions); `stop()` ends it and removes the folder.
 * A process that exits on its own (killed, out of memory) is reported by `exited`.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export type EngineKind = 'redis' | 'etcd';

export interface EngineProcess {
  kind: EngineKind;
  /** The store URL a server takes (`--store`): redis://:PASSWORD@127.0.0.1:PORT or etcd://127.0.0.1:PORT. */
  url: string;
  port: number;
  pid: number;
  dir: string;
  /** Resolves when the process ended, for whatever reason. */
  exited: Promise<number | null>;
  /** Ends the process (SIGTERM, then SIGKILL after 3 s) and removes its data folder. */
  stop(): Promise<void>;
}

const BINARIES: Record<EngineKind, { bin: string; apt: string }> = {
  redis: { bin: 'redis-server', apt: 'redis-server' },
  etcd: { bin: 'etcd', apt: 'etcd-server' },
};

/** Why `kind` cannot start on this machine (its binary is missing), or undefined when it can. */
export function engineMissing(kind: EngineKind): string | undefined {
  const { bin, apt } = BINARIES[kind];
  const found = spawnSync('sh', ['-c', `command -v ${bin}`], { encoding: 'utf8' });
  return found.status === 0 ? undefined : `needs ${bin} (apt-get install -y ${apt})`;
}

/** A port free on 127.0.0.1 now (the OS's pick). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

/** Resolves once 127.0.0.1:port accepts a connection; rejects after `timeoutMs` naming what it waited for. */
export async function waitForPort(port: number, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const c = connect(port, '127.0.0.1');
      c.once('connect', () => {
        c.destroy();
        resolve(true);
      });
      c.once('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`${what} did not listen on 127.0.0.1:${port} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Starts `kind` on free loopback ports, data in a new temporary folder; resolves once it listens. */
export async function startEngine(
  kind: EngineKind,
  /** A port, folder or (Redis) password of an engine to start again (a restart); default new ones. */
  options: { port?: number; dir?: string; password?: string } = {},
): Promise<EngineProcess> {
  const missing = engineMissing(kind);
  if (missing) throw new Error(`cannot start ${kind}: it ${missing}`);
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), `ddp-${kind}-`));
  const port = options.port ?? (await freePort());
  let child: ChildProcess;
  let url: string;
  if (kind === 'redis') {
    const password = options.password ?? randomBytes(18).toString('base64url');
    // The password on stdin's config, not the command line (another user's `ps` would show it).
    child = spawn('redis-server', ['-'], { cwd: dir, stdio: ['pipe', 'ignore', 'pipe'] });
    child.stdin!.end(
      [
        `port ${port}`,
        'bind 127.0.0.1',
        'protected-mode yes',
        `requirepass ${password}`,
        `dir ${dir}`,
        // An append-only file, flushed to the disk every second: a Redis that restarts (crashed,
        // killed, upgraded) comes back with every session's token hashes and keys. No snapshots besides.
        'save ""',
        'appendonly yes',
        'appendfsync everysec',
        'daemonize no',
        'loglevel warning',
      ].join('\n'),
    );
    url = `redis://:${password}@127.0.0.1:${port}`;
  } else {
    const peer = await freePort();
    child = spawn(
      'etcd',
      [
        '--name',
        'ddp',
        '--data-dir',
        join(dir, 'data'),
        '--listen-client-urls',
        `http://127.0.0.1:${port}`,
        '--advertise-client-urls',
        `http://127.0.0.1:${port}`,
        '--listen-peer-urls',
        `http://127.0.0.1:${peer}`,
        '--initial-advertise-peer-urls',
        `http://127.0.0.1:${peer}`,
        '--initial-cluster',
        `ddp=http://127.0.0.1:${peer}`,
        '--log-level',
        'error',
        '--logger',
        'zap',
      ],
      { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    url = `etcd://127.0.0.1:${port}`;
  }
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-2000);
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const killer = setTimeout(() => child.kill('SIGKILL'), 3_000);
      await exited;
      clearTimeout(killer);
    }
    if (!options.dir) rmSync(dir, { recursive: true, force: true });
  };
  try {
    await Promise.race([
      waitForPort(port, kind),
      exited.then((code) => {
        throw new Error(`${kind} exited (${code}) before it listened: ${stderr.trim()}`);
      }),
    ]);
  } catch (err) {
    await stop();
    throw err;
  }
  return { kind, url, port, pid: child.pid!, dir, exited, stop };
}

/** The process's CPU seconds (user + system) and resident bytes, from /proc. */
export function processUsage(pid: number): { cpuSec: number; rssBytes: number } {
  const raw = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const stat = raw.split(') ')[1]!.split(' ');
  return { cpuSec: (Number(stat[11]) + Number(stat[12])) / 100, rssBytes: Number(stat[21]) * 4096 };
}
