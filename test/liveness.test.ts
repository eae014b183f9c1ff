/**
 * How the server judges a member alive (docs/elastic.md, "Detection"): a member whose page's
 * thread is busy past the heartbeat bound while its Worker's pulse beats is kept, up to the busy
 * bound; one that stops beating entirely is evicted at the heartbeat bound. The server runs in a
 * process of its own, so that this test's thread can be the busy page: the members' sockets live
 * on it, and the pulse on a worker thread, as in a tab.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { StoreClient } from '../src/c10d/store.ts';
import { LivenessConfigError, judge, livenessBoundsFromEnv } from '../signaling/pulse.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const HEARTBEAT_MS = 1_500;
const BUSY_MS = 3_500;

let server: ChildProcess | undefined;
let url = '';
const log: string[] = [];

beforeAll(async () => {
  server = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/server_process.ts', String(HEARTBEAT_MS), String(BUSY_MS)], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines = createInterface({ input: server.stdout! });
  url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the server process to print its URL (30 s)')), 30_000);
    lines.on('line', (line) => {
      if (line.startsWith('{')) {
        clearTimeout(timer);
        resolve((JSON.parse(line) as { url: string }).url);
      } else log.push(line);
    });
  });
}, 40_000);

afterAll(() => {
  server?.kill('SIGTERM');
});

/** Holds this thread, as a long step on the cpu backend holds a page's: nothing of its own is sent. */
function busy(ms: number): void {
  for (const end = Date.now() + ms; Date.now() < end; );
}

async function member(session: string, pulse: boolean) {
  const client = await StoreClient.connect(url, { session, token: tokenFor(session), pulse });
  const rounds: number[] = [];
  client.on('round', (e) => rounds.push(e.worldSize));
  const closed = new Promise<{ code: number; reason: string }>((r) => client.on('close', r));
  await client.rendezvous({ min: 1, max: 3 }, 200);
  return { client, rounds, closed };
}

const settle = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('liveness', () => {
  it('keeps a member whose page is busy past the heartbeat bound while its Worker beats; evicts one that stops beating at that bound, and a busy one at the busy bound', async () => {
    const session = uniqueSession('busy');
    const beating = await member(session, true);
    const silent = await member(session, false);
    await expect.poll(() => beating.rounds.at(-1), { timeout: 10_000 }).toBe(2);
    // The pulse has had time to open (it beats from a worker thread).
    await settle(1_000);
    let silentClose: { code: number; reason: string } | undefined;
    void silent.closed.then((c) => (silentClose = c));
    let beatingClose: { code: number; reason: string } | undefined;
    void beating.closed.then((c) => (beatingClose = c));

    // Longer than the heartbeat bound, shorter than the busy bound.
    busy(HEARTBEAT_MS + 1_000);
    await expect.poll(() => silentClose, { timeout: 10_000 }).toBeDefined();
    expect(silentClose!.code).toBe(4003);
    // Evicted on the heartbeat bound (checked every 375 ms here), not the busy one.
    const after = Number(/no heartbeat for (\d+) ms/.exec(silentClose!.reason)?.[1]);
    expect(after).toBeGreaterThan(HEARTBEAT_MS);
    expect(after).toBeLessThan(BUSY_MS);
    // The busy one stays, in the round without the silent one.
    await expect.poll(() => beating.rounds.at(-1), { timeout: 10_000 }).toBe(1);
    await settle(HEARTBEAT_MS);
    expect(beatingClose).toBeUndefined();
    expect(log.some((l) => new RegExp(`silent for \\d+ ms but its Worker beats: busy, kept up to ${BUSY_MS} ms`).test(l))).toBe(true);

    // Busy past the busy bound: a page that never yields is evicted all the same.
    busy(BUSY_MS + 1_500);
    await expect.poll(() => beatingClose, { timeout: 10_000 }).toBeDefined();
    expect(beatingClose!.code).toBe(4003);
    expect(Number(/no heartbeat for (\d+) ms/.exec(beatingClose!.reason)?.[1])).toBeGreaterThan(BUSY_MS);
    beating.client.close();
    silent.client.close();
  }, 60_000);
});

describe('the liveness bounds', () => {
  it('judges silence on the socket by the pulse: busy up to the busy bound, frozen without a pulse', () => {
    expect(judge(4_000, 200, 5_000, 10_000)).toEqual({ keep: true, busy: false });
    expect(judge(8_000, 200, 5_000, 10_000)).toEqual({ keep: true, busy: true });
    expect(judge(8_000, undefined, 5_000, 10_000)).toEqual({
      keep: false,
      reason: 'nothing received from it for 8000 ms (frozen or hung)',
    });
    // A pulse that stopped too (a frozen tab whose Worker froze with it).
    expect(judge(8_000, 6_000, 5_000, 10_000)).toMatchObject({ keep: false });
    expect(judge(11_000, 200, 5_000, 10_000)).toMatchObject({
      keep: false,
      reason: expect.stringMatching(/^its page sent nothing for 11000 ms although its Worker still beat/),
    });
  });

  it('npm start takes HEARTBEAT_TIMEOUT_MS and BUSY_TIMEOUT_MS, and says what to give for a bad one', () => {
    expect(livenessBoundsFromEnv({})).toEqual({});
    expect(livenessBoundsFromEnv({ HEARTBEAT_TIMEOUT_MS: '8000', BUSY_TIMEOUT_MS: '20000' })).toEqual({
      heartbeatTimeoutMs: 8000,
      busyTimeoutMs: 20000,
    });
    expect(() => livenessBoundsFromEnv({ HEARTBEAT_TIMEOUT_MS: '8s' })).toThrow(LivenessConfigError);
    expect(() => livenessBoundsFromEnv({ HEARTBEAT_TIMEOUT_MS: '8s' })).toThrow(
      errorOf(
        LivenessConfigError,
        'HEARTBEAT_TIMEOUT_MS="8s" is not a time the server can use: give whole milliseconds from 100 to 600000, e.g. HEARTBEAT_TIMEOUT_MS=8000',
      ),
    );
    expect(() => livenessBoundsFromEnv({ BUSY_TIMEOUT_MS: '50' })).toThrow(
      errorOf(LivenessConfigError, /BUSY_TIMEOUT_MS="50" is not a time/),
    );
    expect(() => livenessBoundsFromEnv({ HEARTBEAT_TIMEOUT_MS: '8000', BUSY_TIMEOUT_MS: '4000' })).toThrow(
      errorOf(LivenessConfigError, /BUSY_TIMEOUT_MS \(4000\) is shorter than HEARTBEAT_TIMEOUT_MS \(8000\)/),
    );
  });
});
