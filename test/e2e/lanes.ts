/**
 * Lanes on two cores: Playwright runs several workers (playwright.config.ts), and most tests may
 * run beside others (much of their time is waiting: on pages starting, on a launcher's child
 * process, on the network); a test that times heartbeats, stalls or the network (tagged '@solo')
 * runs with every other lane idle, as the whole suite ran before. playwright.config.ts queues
 * them first, on one worker, so in a whole run this lock holds the other worker's first test back
 * until they have all run. A readers-writer lock between the
 * workers: a file per worker in a folder of the run's own (the workers' parent is the runner),
 * changed under a mkdir mutex. A solo request goes first: a shared test waits while a solo one
 * runs or waits, and for a moment after one ends (the worker's next test may be solo too), so a
 * solo file's tests run back to back instead of each waiting out the other workers' tests.
 * A shared test waits at most for the rest of the solo tests of one file.
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
  /** A solo test just ended here: shared tests wait until then for this worker's next test. */
  until?: number;
}

const DIR = join(tmpdir(), `browser-ddp-e2e-lanes-${process.ppid}`);
const MUTEX = join(DIR, 'mutex');
const POLL_MS = 50;
/** A mutex older than this was left by a worker that died holding it. */
const STALE_MUTEX_MS = 5_000;
/** How long after a solo test the lane stays this worker's, for its next test. */
const SOLO_GRACE_MS = 1_500;

/** Waits until this worker may run a test of `mode`; resolves with a release function. */
export async function acquireLane(worker: number, mode: LaneMode, timeoutMs: number): Promise<() => Promise<void>> {
  await mkdir(DIR, { recursive: true });
  const own = join(DIR, `worker-${worker}.json`);
  const since = Date.now();
  for (;;) {
    const granted = await underMutex(async () => {
      const now = Date.now();
      const others = (await othersThan(own)).filter((o) => o.until === undefined || o.until > now);
      // solo: nobody else running; shared: nobody else running solo or waiting to.
      const ok = mode === 'solo' ? !others.some((o) => o.holds) : !others.some((o) => o.mode === 'solo');
      const state: LaneState = { pid: process.pid, mode, holds: ok, since };
      await writeFile(own, JSON.stringify(state));
      return ok;
    });
    if (granted) return () => release(own, mode);
    if (Date.now() - since > timeoutMs) {
      await rm(own, { force: true });
      throw new Error(
        `waited ${timeoutMs} ms for the other Playwright workers' tests to end, to run this ${mode} test (test/e2e/lanes.ts)`,
      );
    }
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

async function release(own: string, mode: LaneMode): Promise<void> {
  if (mode === 'shared') return rm(own, { force: true });
  const now = Date.now();
  const state: LaneState = { pid: process.pid, mode, holds: false, since: now, until: now + SOLO_GRACE_MS };
  await underMutex(() => writeFile(own, JSON.stringify(state)));
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
