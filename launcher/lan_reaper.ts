/**
 * Teardown of `--lan` runs however the process ends (launcher/lan.ts): the reaper that outlives
 * it, and the 'exit' and signal handlers that tear down this process's live LANs.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { stateRoot } from './lan_state.ts';
import { signalExitCode, TERMINATION_SIGNALS } from './signals.ts';

/** What the handlers tear down: a live LAN (lan.ts's Lan). */
export interface LiveLan {
  close(): Promise<void>;
  closeSync(): void;
}

/**
 * The safety net: a detached process (its own session, so Ctrl-C does not reach it) that reads a
 * pipe only this process holds. When this process is gone, however it ended (SIGKILL, a parent
 * such as tsx or npm killing it mid-teardown, a crash), the pipe closes and it removes the run's
 * namespaces, veth and files. After a normal teardown it finds nothing left to remove.
 */
const REAPER = `
const [ip, tag, stateRoot] = process.argv.slice(1);
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const run = (args) => { try { return execFileSync(ip, args, { stdio: ['ignore', 'pipe', 'ignore'], timeout: 15000 }).toString(); } catch { return ''; } };
let done = false;
const reap = () => {
  if (done) return;
  done = true;
  // The run's coturn first (its pid file, checked against its command line: pids are recycled).
  try {
    const dir = path.join(stateRoot, tag);
    const pid = Number(fs.readFileSync(path.join(dir, 'turnserver.pid'), 'utf8').trim());
    const cmd = fs.readFileSync('/proc/' + pid + '/cmdline', 'utf8');
    if (pid > 1 && cmd.includes('turnserver') && cmd.includes(dir)) process.kill(pid, 'SIGKILL');
  } catch {}
  run(['link', 'del', tag + 's']);
  const names = run(['netns', 'list']).split('\\n').map((l) => l.trim().split(/\\s+/)[0]).filter((n) => n && n.startsWith(tag + '-'));
  for (const n of names.sort((a, b) => (a.endsWith('-lan') ? 1 : 0) - (b.endsWith('-lan') ? 1 : 0))) run(['netns', 'del', n]);
  try {
    fs.rmSync(path.join(stateRoot, tag), { recursive: true, force: true });
    for (const e of fs.readdirSync(stateRoot)) {
      if (e.startsWith('subnet-') && fs.readFileSync(path.join(stateRoot, e), 'utf8').trim() === tag) fs.rmSync(path.join(stateRoot, e), { force: true });
    }
  } catch {}
  process.exit(0);
};
process.stdin.on('end', reap);
process.stdin.on('close', reap);
process.stdin.on('error', reap);
process.stdin.resume();
`;

export function startReaper(ip: string, tag: string): ChildProcess {
  const child = spawn(process.execPath, ['-e', REAPER, ip, tag, stateRoot()], {
    detached: true,
    stdio: ['pipe', 'ignore', 'ignore'],
    env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' },
  });
  child.on('error', () => {});
  child.unref();
  (child.stdin as unknown as { unref(): void }).unref();
  child.stdin!.on('error', () => {});
  return child;
}

/** Live LANs of this process, torn down on 'exit' (synchronously) and on signals. */
const live = new Set<LiveLan>();
const onExit = () => {
  for (const lan of [...live]) lan.closeSync();
};
// Node runs no 'exit' handlers on a signal: take it, tear down, and exit as the signal would have.
// The teardown is asynchronous so that the event loop keeps running meanwhile (tsx's child reports
// the signal to its parent over IPC, or is killed); whatever it has not finished when something
// else calls process.exit, the 'exit' handler and the reaper do.
let exiting = false;
const onSignal = (signal: NodeJS.Signals) => {
  const code = signalExitCode(signal);
  if (exiting) return;
  exiting = true;
  setTimeout(() => process.exit(code), 5_000).unref();
  void Promise.all([...live].map((lan) => lan.close())).finally(() => process.exit(code));
};
export function track(lan: LiveLan): void {
  if (live.size === 0) {
    process.on('exit', onExit);
    for (const s of TERMINATION_SIGNALS) process.on(s, onSignal);
  }
  live.add(lan);
}
export function untrack(lan: LiveLan): void {
  if (!live.delete(lan) || live.size > 0) return;
  process.removeListener('exit', onExit);
  for (const s of TERMINATION_SIGNALS) process.removeListener(s, onSignal);
}
