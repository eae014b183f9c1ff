/**
 * `--tabs`: the ranks as pages of ONE headful Chromium under Xvfb, with the browser's default
 * background throttling (none of the throttle-disabling flags of the headless driver). Playwright
 * emulates focus, so its pages stay "visible" even in background tabs: this driver spawns Chromium
 * itself and talks to it over the DevTools protocol (on a pipe, one session per target, kept open for the run).
 * Each rank gets its own window at its own place on a large virtual screen, so every rank is
 * visible (not occluded) until `--hide` opens a blank tab in front of it in its window.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Report } from '../src/jobs/job_report.ts';
import { CHROMIUM_ARGS, chromiumPath } from './browser.ts';
import { signalExitCode, TERMINATION_SIGNALS } from './signals.ts';
import { LOSE_DEVICE_EXPRESSION, checkDeviceLost, type RankDriver, type RankHandlers, type RankTarget } from './driver.ts';

/** The browser's default throttling: the headless flags minus the three that disable it. */
export const TABS_ARGS = CHROMIUM_ARGS.filter(
  (a) =>
    !['--disable-background-timer-throttling', '--disable-renderer-backgrounding', '--disable-backgrounding-occluded-windows'].includes(a),
);

export interface TabsOptions {
  /**
   * Start Chrome's intensive wake-up throttling (one timer wake-up a minute for chained timers)
   * after this many seconds hidden instead of the browser's default grace period (minutes), so that a test sees in seconds what a class sees after minutes.
   */
  intensiveThrottlingAfterSec?: number;
  /** More Chromium args, e.g. `trustArgs(cert)` for a server with a self-signed certificate. */
  extraArgs?: readonly string[];
}

/** TABS_ARGS with the features a run asks for (Chromium reads only one --enable-features). */
export function tabsArgs(o: TabsOptions): string[] {
  const after = o.intensiveThrottlingAfterSec;
  if (after === undefined) return TABS_ARGS;
  if (!(Number.isInteger(after) && after >= 1))
    throw new RangeError(`intensiveThrottlingAfterSec must be a whole number of seconds >= 1, got ${after}`);
  return TABS_ARGS.map((a) => (a.startsWith('--enable-features=') ? `${a},IntensiveWakeUpThrottling:grace_period_seconds/${after}` : a));
}

/**
 * Runs in a hidden rank's page: a chain of 200 ms timers, the longest gap between two of them
 * kept in window.__ddpTimerProbe. It shows how hard the browser throttled the page's own timers
 * (about 1 s: basic throttling; about 60 s: intensive throttling) while the run went on.
 */
const TIMER_PROBE = `(() => {
  const probe = { longestGapMs: 0, ticks: 0, last: performance.now() };
  window.__ddpTimerProbe = probe;
  let last = probe.last;
  const tick = () => {
    const now = performance.now();
    probe.longestGapMs = Math.max(probe.longestGapMs, Math.round(now - last));
    probe.ticks++;
    probe.last = last = now;
    setTimeout(tick, 200);
  };
  setTimeout(tick, 200);
})()`;

const SCREEN = { width: 3840, height: 2160 };
const WINDOW = { width: 900, height: 700 };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  return Promise.race([p, sleep(ms).then(() => Promise.reject(new Error(`no answer in ${ms} ms`)))]);
}

/**
 * The DevTools protocol over the pipe Chromium reads on fd 3 and writes on fd 4
 * (--remote-debugging-pipe: NUL-separated JSON), not over a port: a port on 127.0.0.1 would let
 * any local user drive the tabs and read the session's token from their URLs. Pages are
 * sessions on the one pipe (Target.attachToTarget with flatten).
 */
/** An event's params as the DevTools protocol sends them (JSON objects; each listener reads the fields of its method). */
type CdpParams = Record<string, unknown>;

class CdpPipe {
  private nextId = 0;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; method: string }>();
  private readonly listeners = new Map<string, Array<(method: string, params: CdpParams) => void>>();
  private buffered = '';
  closed = false;
  constructor(
    private readonly out: NodeJS.WritableStream,
    input: NodeJS.ReadableStream,
  ) {
    input.on('data', (chunk: Buffer) => {
      const parts = (this.buffered + chunk.toString('utf8')).split('\0');
      this.buffered = parts.pop() ?? '';
      for (const part of parts) if (part) this.dispatch(part);
    });
    input.on('close', () => this.onClose());
    input.on('error', () => this.onClose());
    out.on('error', () => this.onClose());
  }
  private dispatch(text: string): void {
    const m = JSON.parse(text);
    if (m.id !== undefined) {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if (m.error) p.reject(new Error(`${p.method}: ${m.error.message}`));
      else p.resolve(m.result);
      return;
    }
    if (!m.method) return;
    if (m.method === 'Target.detachedFromTarget') this.emit(m.params.sessionId, '__closed', { reason: 'the tab was detached' });
    this.emit(m.sessionId ?? '', m.method, m.params);
  }
  private emit(sessionId: string, method: string, params: CdpParams): void {
    for (const l of this.listeners.get(sessionId) ?? []) l(method, params);
  }
  private onClose(): void {
    if (this.closed) return;
    this.closed = true;
    for (const p of this.pending.values()) p.reject(new Error(`${p.method}: the DevTools pipe closed`));
    this.pending.clear();
    for (const ls of this.listeners.values()) for (const l of ls) l('__closed', { reason: 'the browser closed its DevTools pipe' });
  }
  send<T = unknown>(method: string, params: Record<string, unknown> = {}, sessionId?: string): Promise<T> {
    if (this.closed) return Promise.reject(new Error(`${method}: the DevTools pipe is closed`));
    const id = ++this.nextId;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: (v) => resolve(v as T), reject, method });
      this.out.write(`${JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) })}\0`);
    });
  }
  on(sessionId: string, listener: (method: string, params: CdpParams) => void): void {
    const ls = this.listeners.get(sessionId) ?? [];
    ls.push(listener);
    this.listeners.set(sessionId, ls);
  }
  /** A connection to one target (a page), or to the browser (`sessionId` ''). */
  session(sessionId: string): Cdp {
    return {
      send: (method, params) => this.send(method, params, sessionId || undefined),
      on: (listener) => this.on(sessionId, listener),
      close: () => {
        this.listeners.delete(sessionId);
        if (sessionId) this.send('Target.detachFromTarget', { sessionId }).catch(() => {});
      },
    };
  }
}

interface Cdp {
  send<T = unknown>(method: string, params?: Record<string, unknown>): Promise<T>;
  on(listener: (method: string, params: CdpParams) => void): void;
  close(): void;
}

/** A console call's arguments as one line (strings as themselves, the rest by value or description). */
function consoleLine(args: Array<{ type: string; value?: unknown; description?: string; unserializableValue?: string }>): string {
  return args
    .map((a) =>
      a.type === 'string'
        ? String(a.value)
        : a.value !== undefined
          ? JSON.stringify(a.value)
          : (a.unserializableValue ?? a.description ?? a.type),
    )
    .join(' ');
}

const SHIM = 'window.__ddpReport = (r) => window.__ddpReportJson(JSON.stringify(r));';

export async function tabsDriver(log: (line: string) => void, options: TabsOptions = {}): Promise<RankDriver> {
  const chromium = startChromium(options);
  const { pipe, killAll } = chromium;
  const browser = pipe.session('');
  const initial = await firstPages(browser, pipe, chromium.exited);
  if (!initial || initial.length === 0) {
    killAll();
    throw new Error('--tabs: Chromium under xvfb-run did not answer on its DevTools pipe (is xvfb installed? apt-get install -y xvfb)');
  }
  const throttling =
    options.intensiveThrottlingAfterSec === undefined
      ? 'default throttling'
      : `default throttling, intensive throttling after ${options.intensiveThrottlingAfterSec} s hidden`;
  log(`[launch] --tabs: headful Chromium under Xvfb (${SCREEN.width}x${SCREEN.height}), DevTools over a pipe (no port), ${throttling}`);
  let count = 0;
  let initialClosed = false;

  return {
    name: 'tabs',
    async newRank(h: RankHandlers): Promise<RankTarget> {
      const { targetId, windowId } = await openRankWindow(browser, count++);
      if (!initialClosed) {
        // The command line's first window would overlap the ranks' windows.
        initialClosed = true;
        for (const t of initial) await browser.send('Target.closeTarget', { targetId: t.targetId }).catch(() => {});
      }
      const { sessionId } = await browser.send<{ sessionId: string }>('Target.attachToTarget', { targetId, flatten: true });
      const page = pipe.session(sessionId);
      const tab = { browser, page, targetId, windowId, closing: false };
      page.on((method, params) => forwardPageEvent(h, tab, method, params));
      await page.send('Runtime.enable');
      await page.send('Page.enable');
      await page.send('Inspector.enable').catch(() => {});
      await page.send('Runtime.addBinding', { name: '__ddpReportJson' });
      await page.send('Page.addScriptToEvaluateOnNewDocument', { source: SHIM });
      return rankTarget(tab);
    },
    async close(): Promise<void> {
      await browser.send('Browser.close').catch(() => {});
      browser.close();
      for (let i = 0; i < 20 && !chromium.exited(); i++) await sleep(100);
      killAll();
      chromium.unhook();
    },
  };
}

/** The one Chromium of a --tabs run: its DevTools pipe, and how to end its process group. */
interface TabsChromium {
  pipe: CdpPipe;
  exited(): boolean;
  /** Kills the process group (Chromium and its Xvfb) and removes the profile. */
  killAll(): void;
  /** Drops the launcher's exit and signal handlers. */
  unhook(): void;
}

/** Spawns headful Chromium under xvfb-run, in a process group of its own, driven over a pipe. */
function startChromium(options: TabsOptions): TabsChromium {
  const args = tabsArgs(options);
  const userDataDir = mkdtempSync(join(tmpdir(), 'ddp-tabs-'));
  const child: ChildProcess = spawn(
    'xvfb-run',
    [
      '-a',
      '-s',
      `-screen 0 ${SCREEN.width}x${SCREEN.height}x24`,
      chromiumPath(),
      ...args,
      ...(options.extraArgs ?? []),
      '--remote-debugging-pipe',
      `--user-data-dir=${userDataDir}`,
      `--window-size=${WINDOW.width},${WINDOW.height}`,
      '--window-position=0,0',
      'about:blank',
    ],
    // fd 3: what Chromium reads (our commands), fd 4: what it writes; xvfb-run passes them on.
    { stdio: ['ignore', 'ignore', 'ignore', 'pipe', 'pipe'], detached: true },
  );
  let exited = false;
  child.on('exit', () => (exited = true));
  const killAll = () => {
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      /* already gone */
    }
    rmSync(userDataDir, { recursive: true, force: true });
  };
  const onExit = () => killAll();
  process.once('exit', onExit);
  // Ctrl-C (or a kill) must not leave a headful Chromium and its Xvfb behind: Node runs no 'exit'
  // handlers on a signal, so take it, clean up, and exit as the signal would have.
  const onSignal = (signal: NodeJS.Signals) => {
    killAll();
    process.exit(signalExitCode(signal));
  };
  for (const signal of TERMINATION_SIGNALS) process.once(signal, onSignal);
  const pipe = new CdpPipe(child.stdio[3] as NodeJS.WritableStream, child.stdio[4] as NodeJS.ReadableStream);
  const unhook = () => {
    process.removeListener('exit', onExit);
    for (const signal of TERMINATION_SIGNALS) process.removeListener(signal, onSignal);
  };
  return { pipe, exited: () => exited, killAll, unhook };
}

/** The pages Chromium opened from its command line, once it answers (up to 30 s); undefined or none if it never does. */
async function firstPages(
  browser: Cdp,
  pipe: CdpPipe,
  exited: () => boolean,
): Promise<Array<{ targetId: string; type: string }> | undefined> {
  let initial: Array<{ targetId: string; type: string }> | undefined;
  for (let i = 0; i < 120 && !exited() && !pipe.closed; i++) {
    try {
      initial = (
        await withTimeout(browser.send<{ targetInfos: Array<{ targetId: string; type: string }> }>('Target.getTargets'), 1000)
      ).targetInfos.filter((t) => t.type === 'page');
      if (initial.length > 0) break;
    } catch {
      /* not up yet */
    }
    await sleep(250);
  }
  return initial;
}

/** A new window for rank number `index`, at its own place on the screen (a grid of WINDOW-sized cells). */
async function openRankWindow(browser: Cdp, index: number): Promise<{ targetId: string; windowId: number }> {
  const cols = Math.floor(SCREEN.width / WINDOW.width);
  const bounds = {
    left: (index % cols) * WINDOW.width,
    top: Math.floor(index / cols) * WINDOW.height,
    width: WINDOW.width,
    height: WINDOW.height,
  };
  const { targetId } = await browser.send<{ targetId: string }>('Target.createTarget', { url: 'about:blank', newWindow: true, ...bounds });
  const { windowId } = await browser.send<{ windowId: number }>('Browser.getWindowForTarget', { targetId });
  await browser.send('Browser.setWindowBounds', { windowId, bounds: { windowState: 'normal' } }).catch(() => {});
  await browser.send('Browser.setWindowBounds', { windowId, bounds });
  return { targetId, windowId };
}

/** A rank's tab: its target and window, its DevTools session, and whether it is being closed on purpose. */
interface RankTab {
  browser: Cdp;
  page: Cdp;
  targetId: string;
  windowId: number;
  closing: boolean;
}

/** Passes a rank page's DevTools event on to the run: reports, console lines, crashes. */
function forwardPageEvent(h: RankHandlers, tab: RankTab, method: string, params: CdpParams): void {
  switch (method) {
    case 'Runtime.bindingCalled':
      if (params.name === '__ddpReportJson') h.onReport(JSON.parse(String(params.payload)) as Report);
      return;
    case 'Runtime.consoleAPICalled':
      h.onConsole(consoleLine((params.args ?? []) as Parameters<typeof consoleLine>[0]));
      return;
    case 'Runtime.exceptionThrown': {
      const d = params.exceptionDetails as { exception?: { description?: string }; text?: string } | undefined;
      h.onConsole(`page error: ${d?.exception?.description ?? d?.text ?? 'unknown'}`);
      return;
    }
    case 'Inspector.targetCrashed':
      h.onCrash('the page crashed');
      return;
    case 'Inspector.detached':
    case '__closed':
      if (!tab.closing) h.onCrash(`the tab went away (${params.reason ?? 'DevTools connection closed'})`);
      tab.closing = true;
      return;
  }
}

/** What the run may do to a rank's tab: open its page, kill, freeze or hide it, and ask it questions. */
function rankTarget(tab: RankTab): RankTarget {
  const { browser, page, targetId } = tab;
  const evaluate = async (expression: string, timeoutMs = 5000): Promise<unknown> => {
    const res = await Promise.race([
      page.send<{ result: { value?: unknown }; exceptionDetails?: { text: string } }>('Runtime.evaluate', {
        expression,
        returnByValue: true,
      }),
      sleep(timeoutMs).then(() => {
        throw new Error(`no answer in ${timeoutMs} ms`);
      }),
    ]);
    if (res.exceptionDetails) throw new Error(res.exceptionDetails.text);
    return res.result.value;
  };
  return {
    open: async (url) => {
      const r = await page.send<{ errorText?: string }>('Page.navigate', { url });
      if (r.errorText) throw new Error(`could not open ${url}: ${r.errorText}`);
    },
    kill: async () => {
      tab.closing = true;
      await browser.send('Target.closeTarget', { targetId });
      page.close();
    },
    freeze: async (flog) => {
      // As freezePage (driver.ts): the lifecycle freeze, and its JavaScript paused too, always:
      // a probe of whether the page still ran could take longer than its bound on a busy machine.
      await page.send('Page.setWebLifecycleState', { state: 'frozen' });
      await page.send('Debugger.enable');
      await page.send('Debugger.pause');
      flog('[launch] page frozen (lifecycle state "frozen", and its JavaScript paused)');
    },
    hide: (hlog) => hideTab(tab, evaluate, hlog),
    loseDevice: async () => checkDeviceLost(await evaluate(LOSE_DEVICE_EXPRESSION)),
    visibility: async () => String(await evaluate('document.visibilityState').catch((e: Error) => `error: ${e.message}`)),
    timerProbe: async () => {
      // The gap still open counts too: a throttled page may not have woken since.
      const v = await evaluate(
        'window.__ddpTimerProbe ? { ...window.__ddpTimerProbe, longestGapMs: Math.max(window.__ddpTimerProbe.longestGapMs, Math.round(performance.now() - window.__ddpTimerProbe.last)) } : null',
      ).catch(() => null);
      return v && typeof v === 'object' ? (v as { longestGapMs: number; ticks: number }) : undefined;
    },
  };
}

/**
 * A blank tab in the rank's own window, in front of the rank's tab: focus the rank's window, open
 * the tab there, and check that it landed in that window (else minimize the rank's window).
 */
async function hideTab(tab: RankTab, evaluate: (expression: string) => Promise<unknown>, hlog: (line: string) => void): Promise<void> {
  const { browser, targetId, windowId } = tab;
  await browser.send('Target.activateTarget', { targetId });
  const { targetId: blank } = await browser.send<{ targetId: string }>('Target.createTarget', { url: 'about:blank' });
  const { windowId: w } = await browser.send<{ windowId: number }>('Browser.getWindowForTarget', { targetId: blank });
  if (w !== windowId) {
    hlog(`[launch] the blank tab opened in window ${w}, not the rank's window ${windowId}; minimizing the rank's window instead`);
    await browser.send('Target.closeTarget', { targetId: blank }).catch(() => {});
    await browser.send('Browser.setWindowBounds', { windowId, bounds: { windowState: 'minimized' } });
  } else {
    await browser.send('Target.activateTarget', { targetId: blank });
  }
  await evaluate(TIMER_PROBE).catch((e: Error) => hlog(`[launch] could not start the timer probe: ${e.message}`));
  await sleep(200);
  hlog(
    `[launch] rank tab visibility after hiding: ${String(await evaluate('document.visibilityState').catch((e: Error) => `error: ${e.message}`))}`,
  );
}
