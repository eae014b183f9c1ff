/**
 * The server alone in a child process, as the store benches measure it (its CPU read from /proc
 * by pid), with room on one address for every socket a bench opens.
 */
import { spawn } from 'node:child_process';
import { PROJECT_ROOT } from '../signaling/package_root.ts';

export async function startServerProcess(o: { sockets: number; sessions: number }): Promise<{ url: string; pid: number; stop(): void }> {
  const limits = JSON.stringify({ maxConnectionsPerAddress: o.sockets + 64, maxSessions: o.sessions + 16 });
  const code = `
    import { startServer } from './signaling/server.ts';
    const s = await startServer({ port: 0, log: () => {}, limits: ${limits} });
    console.log(JSON.stringify({ url: s.url }));
  `;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], {
    cwd: PROJECT_ROOT,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (line) resolve((JSON.parse(line) as { url: string }).url);
    });
    child.on('exit', (c) => reject(new Error(`the server process exited (${c}) before it listened`)));
    setTimeout(() => reject(new Error('the server process did not listen within 30 s')), 30_000).unref();
  });
  return { url, pid: child.pid!, stop: () => child.kill() };
}
