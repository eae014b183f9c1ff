/**
 * Two lanes on two cores: Playwright runs two workers, and most tests may run beside another one
 * (much of their time is waiting: on pages starting, on a launcher's child process, on the
 * network); a file that times heartbeats, stalls or the network (`test.use({ solo: true })`) runs
 * with the other lane idle, as the whole suite ran before. A readers-writer lock between the
 * workers: a file per worker in a folder of the run's own (the workers' parent is the runner),
 * changed under a mkdir mutex; requests that conflict are granted first come, first served, so
 * neither kind waits behind an endless line of the other.
 */
import { mkdir, readdir, readFile, rm, rmdir, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export type LaneMode = 'solo' | 'shared';

interface LaneState {
  pid: number;
  mode: LaneMode;
  /** Holding the lane, or still waiting for it (since `since`). */
  holds: boolean;
  since: number;
}

const DIR = join(tmpdir(), `browser-ddp-e2e-lanes-${process.ppid}`);
const MUTEX = join(DIR, 'mutex');
const POLL_MS = 50;
/** A mutex older than this was left by a worker that died holding it. */
const STALE_MUTEX_MS = 5_000;

/** Waits until this worker may run a test of `mode`; resolves with a release function. */
export async function acquireLane(worker: number, mode: LaneMode, timeoutMs: number): Promise<() => Promise<void>> {
  await mkdir(DIR, { recursive: true });
  const own = join(DIR, `worker-${worker}.json`);
  const since = Date.now();
  for (;;) {
    const granted = await underMutex(async () => {
      const others = await othersThan(own);
      const conflicts = (o: LaneState) => mode === 'solo' || o.mode === 'solo';
      const ok = !others.some((o) => conflicts(o) && (o.holds || o.since < since));
      const state: LaneState = { pid: process.pid, mode, holds: ok, since };
      await writeFile(own, JSON.stringify(state));
      return ok;
    });
    if (granted) return () => rm(own, { force: true });
    if (Date.now() - since > timeoutMs) {
      await rm(own, { force: true });
      throw new Error(`waited ${timeoutMs} ms for the other Playwright worker's test to end, to run this ${mode} test (test/e2e/lanes.ts)`);
    }
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

/** The other workers' states, but for workers that are gone (a worker that crashed leaves its file). */
async function othersThan(own: string): Promise<LaneState[]> {
  const states: LaneState[] = [];
  for (const name of await readdir(DIR)) {
    const file = join(DIR, name);
    if (!name.startsWith('worker-') || file === own) continue;
    const state = JSON.parse(await readFile(file, 'utf8').catch(() => 'null')) as LaneState | null;
    if (state && alive(state.pid)) states.push(state);
  }
  return states;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function underMutex<T>(fn: () => Promise<T>): Promise<T> {
  for (;;) {
    try {
      await mkdir(MUTEX);
      break;
    } catch {
      const info = await stat(MUTEX).catch(() => undefined);
      if (info && Date.now() - info.mtimeMs > STALE_MUTEX_MS) await rmdir(MUTEX).catch(() => {});
      await new Promise((r) => setTimeout(r, 5));
    }
  }
  try {
    return await fn();
  } finally {
    await rmdir(MUTEX);
  }
}
