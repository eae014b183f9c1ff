/**
 * `npm run cluster -- --servers 3 [--port 8080]`: several servers behind one address on this
 * machine: Redis (the shared store), N server processes on it, and HAProxy in front, each on
 * loopback ports of its own; Ctrl-C stops them all and removes their temporary folder. The proxy
 * routes each session's sockets to one server (a consistent hash of the socket URL's `session`),
 * spreads the rest (pages, API) over all, checks each server every second and sends a dead
 * one's sessions to the others; the store's keys and tokens are in Redis, so they rejoin there.
 * `startCluster` is the same for tests.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { PROJECT_ROOT } from '../signaling/package_root.ts';
import { engineMissing, freePort, startEngine, waitForPort, type EngineProcess } from './cluster_engines.ts';

export interface ClusterServer {
  port: number;
  url: string;
  process: ChildProcess;
  /** The server's log lines so far. */
  log: string[];
}

export interface Cluster {
  /** The one address: http://127.0.0.1:PORT/ (the proxy). */
  url: string;
  engine: EngineProcess;
  servers: ClusterServer[];
  proxy: ChildProcess;
  /** Stops the proxy, the servers and the engine (SIGTERM, then SIGKILL), and removes the temporary folder. */
  stop(): Promise<void>;
}

/** HAProxy's configuration: WebSockets to one server per session (consistent hash), health checks every second. */
export function haproxyConfig(port: number, servers: number[]): string {
  return [
    'global',
    '  maxconn 8000',
    'defaults',
    '  mode http',
    '  timeout connect 2s',
    '  timeout client 60s',
    '  timeout server 60s',
    // A loaded server (hundreds of tabs joining at once) answers its check late, not never.
    '  timeout check 3s',
    // An open WebSocket is a tunnel: idle for up to an hour between frames (the server pings every 15 s).
    '  timeout tunnel 1h',
    'frontend ddp',
    `  bind 127.0.0.1:${port}`,
    '  default_backend servers',
    'backend servers',
    // Every socket of a session to one server; a server down moves only its own sessions.
    '  balance url_param session',
    '  hash-type consistent',
    // A socket to a server that just died (not yet marked down) goes to another at once.
    '  option redispatch',
    '  retries 2',
    '  option httpchk',
    '  http-check send meth GET uri /api/info ver HTTP/1.1 hdr Host 127.0.0.1',
    '  http-check expect status 200',
    '  default-server inter 1s fall 3 rise 2',
    ...servers.map((p, i) => `  server s${i + 1} 127.0.0.1:${p} check`),
    '',
  ].join('\n');
}

export async function startClusterServer(port: number, store: string, settleMs?: number): Promise<ClusterServer> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', join(PROJECT_ROOT, 'scripts', 'cluster_server.ts'), String(port), ...(settleMs ? [String(settleMs)] : [])],
    {
      cwd: PROJECT_ROOT,
      env: { ...process.env, DDP_STORE: store },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  const log: string[] = [];
  let out = '';
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server on port ${port} did not listen within 30 s: ${log.join('\n')}`)), 30_000);
    const onLine = (line: string) => {
      log.push(line);
      if (line.startsWith('{"url"')) {
        clearTimeout(timer);
        resolve((JSON.parse(line) as { url: string }).url);
      }
    };
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const lines = out.split('\n');
      out = lines.pop()!;
      lines.forEach(onLine);
    });
    child.stderr!.on('data', (d: Buffer) => log.push(d.toString()));
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server on port ${port} exited (${code}) before it listened: ${log.join('\n')}`));
    });
  });
  return { port, url, process: child, log };
}

function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const killer = setTimeout(() => child.kill('SIGKILL'), 3_000);
    child.once('exit', () => {
      clearTimeout(killer);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

/** Starts Redis, `servers` servers on it and HAProxy in front (on `port`, default a free one). */
export async function startCluster(options: { servers: number; port?: number; settleMs?: number; proxyLog?: boolean }): Promise<Cluster> {
  for (const need of [engineMissing('redis'), haproxyMissing()]) if (need) throw new Error(`the cluster ${need}`);
  const dir = mkdtempSync(join(tmpdir(), 'ddp-cluster-'));
  const started: ChildProcess[] = [];
  let engine: EngineProcess | undefined;
  const stop = async () => {
    await Promise.all(started.map(stopProcess));
    await engine?.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    engine = await startEngine('redis', { dir });
    const servers: ClusterServer[] = [];
    for (let i = 0; i < options.servers; i++) {
      const s = await startClusterServer(await freePort(), engine.url, options.settleMs);
      started.push(s.process);
      servers.push(s);
    }
    const port = options.port ?? (await freePort());
    const cfg = join(dir, 'haproxy.cfg');
    writeFileSync(
      cfg,
      haproxyConfig(
        port,
        servers.map((s) => s.port),
      ),
      { mode: 0o600 },
    );
    // -db: in the foreground, so it is this process's child and ends with it.
    const proxy = spawn('haproxy', ['-f', cfg, '-db'], { stdio: ['ignore', 'ignore', options.proxyLog ? 'inherit' : 'ignore'] });
    started.push(proxy);
    await waitForPort(port, 'haproxy');
    return { url: `http://127.0.0.1:${port}/`, engine, servers, proxy, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Why HAProxy cannot start here, or undefined. */
export function haproxyMissing(): string | undefined {
  const found = [process.env.PATH ?? '', '/usr/sbin', '/sbin']
    .join(':')
    .split(':')
    .some((d) => {
      try {
        return d !== '' && statSync(join(d, 'haproxy')).isFile();
      } catch {
        return false;
      }
    });
  return found ? undefined : 'needs haproxy (apt-get install -y haproxy)';
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { servers: { type: 'string', default: '3' }, port: { type: 'string', default: '8080' } } });
  const n = Number(values.servers);
  const port = Number(values.port);
  if (!Number.isInteger(n) || n < 1 || n > 16) throw new Error(`--servers ${values.servers}: give 1 to 16 servers`);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`--port ${values.port}: give a port 1-65535`);
  const { ensureBuilt } = await import('../signaling/build.ts');
  await ensureBuilt();
  const cluster = await startCluster({ servers: n, port, proxyLog: true });
  console.log(`Redis (the shared store) on 127.0.0.1:${cluster.engine.port}, its data in ${cluster.engine.dir}`);
  for (const s of cluster.servers) console.log(`server on ${s.url} (pid ${s.process.pid})`);
  console.log(`Open ${cluster.url} : HAProxy in front of ${n} servers. Ctrl-C stops them all.`);
  let stopping = false;
  const end = () => {
    if (stopping) return;
    stopping = true;
    void cluster.stop().then(() => process.exit(0));
  };
  process.on('SIGINT', end);
  process.on('SIGTERM', end);
  for (const s of cluster.servers)
    s.process.once(
      'exit',
      (code) => !stopping && console.log(`server ${s.url} exited (${code}); HAProxy sends its sessions to the others`),
    );
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((err: unknown) => {
    console.error((err as Error).message);
    process.exit(1);
  });
}
