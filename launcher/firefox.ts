/**
 * Firefox ranks: Debian's firefox-esr as a plain process, one per rank, each with a fresh profile
 * (a user.js that turns off first-run pages, telemetry, updates and background networking; there is
 * no internet) and a virtual screen of its own (xvfb-run): headless (MOZ_HEADLESS=1) Firefox has no
 * WebGL here, under Xvfb it has WebGL 2 on Mesa's llvmpipe, as a person's Firefox without WebGPU
 * falls back to. Playwright 1.65's BiDi Firefox cannot drive this ESR
 * (`newPage` fails on `emulation.setMediaFeaturesOverride: unknown command`), so the launcher speaks
 * WebDriver BiDi itself (Firefox's own `--remote-debugging-port`, a websocket) with the few commands
 * every Firefox since 2023 has: a preload script defines `window.__ddpReport` before the page's own
 * scripts run and forwards each report over a BiDi channel (`script.message`), the console comes as
 * `log.entryAdded`, and `script.evaluate` answers the launcher's questions. A Firefox rank thus
 * reports its own rank, elastic events and result like a Chromium one.
 *
 * Killing a rank kills its process group (the browser and its content processes); `close()` kills
 * every one still running and removes their profiles, also when the run failed, and so do Ctrl-C
 * and the launcher's exit.
 */
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { FirefoxProcessGroup } from './firefox_process.ts';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WebSocket } from 'ws';
import type { Report } from '../src/jobs/job_report.ts';
import { LOSE_DEVICE_EXPRESSION, checkDeviceLost, type RankDriver, type RankHandlers, type RankTarget } from './driver.ts';

export function firefoxPath(): string {
  const path = process.env.FIREFOX_PATH ?? '/usr/bin/firefox-esr';
  if (!existsSync(path)) {
    throw new Error(`Firefox not found at ${path}: install Debian's package (apt-get install -y firefox-esr) or set FIREFOX_PATH`);
  }
  return path;
}

/**
 * The rank profile's preferences: no first-run or what's-new pages, no default-browser question,
 * no telemetry or data reporting, no updates (app, add-ons, system add-ons), no background
 * networking (remote settings, experiments, safe browsing, captive-portal and connectivity checks,
 * prefetching, the new-tab page), and no throttling of a page's timers.
 */
export const FIREFOX_PREFS: Readonly<Record<string, string | number | boolean>> = {
  'browser.shell.checkDefaultBrowser': false,
  'browser.startup.homepage_override.mstone': 'ignore',
  'browser.startup.page': 0,
  'startup.homepage_welcome_url': '',
  'startup.homepage_welcome_url.additional': '',
  'browser.aboutwelcome.enabled': false,
  'trailhead.firstrun.didSeeAboutWelcome': true,
  'browser.sessionstore.resume_from_crash': false,
  'browser.tabs.warnOnClose': false,
  'datareporting.policy.dataSubmissionEnabled': false,
  'datareporting.healthreport.uploadEnabled': false,
  'datareporting.usage.uploadEnabled': false,
  'toolkit.telemetry.enabled': false,
  'toolkit.telemetry.unified': false,
  'toolkit.telemetry.archive.enabled': false,
  'toolkit.telemetry.server': '',
  'toolkit.telemetry.reportingpolicy.firstRun': false,
  'app.update.auto': false,
  'app.update.enabled': false,
  'app.update.disabledForTesting': true,
  'app.normandy.enabled': false,
  'app.shield.optoutstudies.enabled': false,
  'messaging-system.rsexperimentloader.enabled': false,
  'services.settings.server': 'data:,#remote-settings-dummy/v1',
  'extensions.update.enabled': false,
  'extensions.blocklist.enabled': false,
  'extensions.systemAddon.update.enabled': false,
  'extensions.getAddons.cache.enabled': false,
  'browser.safebrowsing.malware.enabled': false,
  'browser.safebrowsing.phishing.enabled': false,
  'browser.safebrowsing.downloads.enabled': false,
  'browser.safebrowsing.blockedURIs.enabled': false,
  'browser.safebrowsing.provider.mozilla.updateURL': '',
  'network.captive-portal-service.enabled': false,
  'network.connectivity-service.enabled': false,
  'network.prefetch-next': false,
  'network.dns.disablePrefetch': true,
  'network.http.speculative-parallel-limit': 0,
  'browser.newtabpage.enabled': false,
  'browser.newtab.preload': false,
  'browser.newtabpage.activity-stream.feeds.system.topstories': false,
  'browser.newtabpage.activity-stream.feeds.snippets': false,
  'browser.ping-centre.telemetry': false,
  'browser.search.update': false,
  'browser.region.network.url': '',
  'browser.region.update.enabled': false,
  'geo.provider.network.url': '',
  'media.gmp-manager.url': '',
  'media.gmp-gmpopenh264.enabled': false,
  'browser.contentblocking.report.lockwise.enabled': false,
  'identity.fxaccounts.enabled': false,
  'dom.push.connection.enabled': false,
  // A rank's page keeps training when its window is not in front.
  'dom.min_background_timeout_value': 4,
  'dom.timeout.enable_budget_timer_throttling': false,
  'widget.windows.window_occlusion_tracking.enabled': false,
};

/** The profile's user.js for `prefs`. */
export function userJs(prefs: Readonly<Record<string, string | number | boolean>> = FIREFOX_PREFS): string {
  return `${Object.entries(prefs)
    .map(([k, v]) => `user_pref(${JSON.stringify(k)}, ${JSON.stringify(v)});`)
    .join('\n')}\n`;
}

/** The environment without MOZ_HEADLESS (Firefox is headless when it is set to anything, even empty). */
function withoutHeadless(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const { MOZ_HEADLESS: _h, ...rest } = env;
  return rest;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Rejects after `ms` with an error naming `what`. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms))),
  ]).finally(() => clearTimeout(timer));
}

/** A WebDriver BiDi event: its method and parameters. */
export interface BidiEvent {
  method: string;
  params: Record<string, unknown>;
}

/** A WebDriver BiDi connection (the `/session` websocket of a browser's remote agent). */
export class Bidi {
  private nextId = 0;
  private pending = new Map<number, { resolve: (v: Record<string, unknown>) => void; reject: (e: Error) => void; method: string }>();
  private listeners: Array<(e: BidiEvent) => void> = [];
  closed = false;
  private constructor(private ws: WebSocket) {
    ws.on('message', (data) => {
      let m: {
        id?: number;
        type?: string;
        result?: Record<string, unknown>;
        error?: string;
        message?: string;
        method?: string;
        params?: Record<string, unknown>;
      };
      try {
        m = JSON.parse(data.toString()) as typeof m;
      } catch {
        return;
      }
      if (m.id !== undefined) {
        const p = this.pending.get(m.id);
        if (!p) return;
        this.pending.delete(m.id);
        if (m.type === 'error') p.reject(new Error(`${p.method}: ${m.error ?? 'error'}${m.message ? `: ${m.message}` : ''}`));
        else p.resolve(m.result ?? {});
      } else if (m.method) {
        for (const l of this.listeners) l({ method: m.method, params: m.params ?? {} });
      }
    });
    ws.on('close', () => {
      this.closed = true;
      for (const p of this.pending.values()) p.reject(new Error(`${p.method}: the WebDriver BiDi connection closed`));
      this.pending.clear();
      for (const l of this.listeners) l({ method: '__closed', params: {} });
    });
  }
  static async connect(url: string, timeoutMs: number): Promise<Bidi> {
    const ws = new WebSocket(url, { perMessageDeflate: false, maxPayload: 256 * 1024 * 1024 });
    await within(
      new Promise<void>((resolve, reject) => {
        ws.once('open', () => resolve());
        ws.once('error', reject);
      }),
      timeoutMs,
      `Firefox's WebDriver BiDi websocket ${url} to open`,
    ).catch((err: Error) => {
      ws.terminate();
      throw err;
    });
    return new Bidi(ws);
  }
  send(method: string, params: Record<string, unknown> = {}, timeoutMs = 30_000): Promise<Record<string, unknown>> {
    if (this.closed) return Promise.reject(new Error(`${method}: the WebDriver BiDi connection is closed`));
    const id = ++this.nextId;
    const answer = new Promise<Record<string, unknown>>((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.ws.send(JSON.stringify({ id, method, params }));
    });
    return within(answer, timeoutMs, `Firefox's answer to ${method}`).finally(() => this.pending.delete(id));
  }
  on(listener: (e: BidiEvent) => void): void {
    this.listeners.push(listener);
  }
  close(): void {
    this.closed = true;
    this.ws.close();
  }
}

/** The channel the preload script reports on. */
const REPORT_CHANNEL = 'ddp-report';
/** Runs in every document of the rank before its own scripts: `window.__ddpReport` forwards over the channel. */
const PRELOAD = `(send) => { window.__ddpReport = (r) => send(JSON.stringify(r)); }`;

/** A value `script.evaluate` returned (a BiDi RemoteValue), as plain JSON for the few types the launcher asks for. */
function fromRemote(v: unknown): unknown {
  if (!v || typeof v !== 'object') return undefined;
  const r = v as { type: string; value?: unknown };
  switch (r.type) {
    case 'string':
    case 'boolean':
      return r.value;
    case 'number':
      return typeof r.value === 'number' ? r.value : Number(r.value);
    case 'null':
    case 'undefined':
      return null;
    case 'object':
      return Object.fromEntries(
        ((r.value as Array<[unknown, unknown]>) ?? []).map(([k, val]) => [
          typeof k === 'string' ? k : String(fromRemote(k)),
          fromRemote(val),
        ]),
      );
    case 'array':
      return ((r.value as unknown[]) ?? []).map(fromRemote);
    default:
      return `[${r.type}]`;
  }
}

/** One Firefox process: its profile, its BiDi session and its single page's browsing context. */
export interface FirefoxInstance {
  readonly pid: number;
  readonly profileDir: string;
  readonly bidi: Bidi;
  /** The top-level browsing context of its one tab. */
  readonly context: string;
  /** True once the process and everything it started (its process group) are gone. */
  exited(): boolean;
  /** Evaluates `expression` in the page (awaiting a promise); its value as JSON-like data. */
  evaluate(expression: string, timeoutMs?: number): Promise<unknown>;
  /** Ends the process group (SIGTERM, SIGKILL 2 s later for what is left) and removes the profile. Safe to call twice. */
  kill(): void;
}

export interface FirefoxOptions {
  /** Called when the process exits without kill() (a crash, or Firefox quitting). */
  onExit?: (how: string) => void;
  /** Each BiDi event. */
  onEvent?: (e: BidiEvent) => void;
  /** How long to wait for Firefox's remote agent to come up (default 30 s). */
  startTimeoutMs?: number;
  /** Preferences on top of FIREFOX_PREFS. */
  prefs?: Readonly<Record<string, string | number | boolean>>;
  /**
   * 'xvfb' (the default): a normal Firefox on a virtual screen of its own (xvfb-run), which has
   * WebGL (Mesa's llvmpipe) as a person's Firefox does; 'headless' (MOZ_HEADLESS=1): no WebGL here
   * ("Exhausted GL driver options"), so the page trains on TF.js's cpu backend.
   */
  display?: 'xvfb' | 'headless';
}

/**
 * Starts Firefox (under Xvfb, or headless) with a fresh profile and its WebDriver BiDi agent on a
 * free port, opens a session, subscribes to reports (`script.message`), the console
 * (`log.entryAdded`) and the tab's end, and adds the preload script that defines `__ddpReport`.
 */
export async function launchFirefox(o: FirefoxOptions = {}): Promise<FirefoxInstance> {
  const executable = firefoxPath();
  const profileDir = mkdtempSync(join(tmpdir(), 'ddp-firefox-'));
  writeFileSync(join(profileDir, 'user.js'), userJs({ ...FIREFOX_PREFS, ...o.prefs }));
  // Port 0: Firefox picks a free one and prints it ("WebDriver BiDi listening on ws://127.0.0.1:PORT").
  // Until our session.new, any local process that finds the port could take the session (Firefox
  // has no pipe): we connect at once, and a lost race fails the launch (docs/deployment.md, Security).
  const firefoxArgs = ['-no-remote', '-profile', profileDir, '--remote-debugging-port=0', '--remote-allow-hosts=127.0.0.1', 'about:blank'];
  const display = o.display ?? 'xvfb';
  const [command, args] =
    display === 'xvfb' ? ['xvfb-run', ['-a', '-s', '-screen 0 1280x800x24', executable, ...firefoxArgs]] : [executable, firefoxArgs];
  const env = {
    ...withoutHeadless(process.env),
    ...(display === 'headless' ? { MOZ_HEADLESS: '1' } : {}),
    MOZ_CRASHREPORTER_DISABLE: '1',
    MOZ_DISABLE_AUTO_SAFE_MODE: '1',
  };
  const group = new FirefoxProcessGroup(command, args, env, executable, profileDir, o.onExit);
  try {
    const wsBase = await within(group.listening, o.startTimeoutMs ?? 30_000, `${executable} to start its WebDriver BiDi agent`);
    const { bidi, context, evaluate } = await openSession(wsBase, o.onEvent);
    return { pid: group.pid, profileDir, bidi, context, exited: () => group.exited(), evaluate, kill: () => group.kill() };
  } catch (err) {
    // The exit handler unhooks once the group is gone.
    group.kill();
    throw err;
  }
}

/**
 * Opens the BiDi session on Firefox's agent: subscribes to reports, the console and the tab's end,
 * and adds the preload script that defines `__ddpReport`; `evaluate` runs an expression in the tab.
 */
async function openSession(
  wsBase: string,
  onEvent: ((e: BidiEvent) => void) | undefined,
): Promise<Pick<FirefoxInstance, 'bidi' | 'context' | 'evaluate'>> {
  const bidi = await Bidi.connect(`${wsBase.replace(/\/$/, '')}/session`, 10_000);
  if (onEvent) bidi.on(onEvent);
  await bidi.send('session.new', { capabilities: { alwaysMatch: { unhandledPromptBehavior: { default: 'ignore' } } } });
  const tree = await bidi.send('browsingContext.getTree', { maxDepth: 0 });
  const context = (tree.contexts as Array<{ context: string }> | undefined)?.[0]?.context;
  if (!context) throw new Error('Firefox has no browsing context (browsingContext.getTree answered none)');
  await bidi.send('session.subscribe', { events: ['script.message', 'log.entryAdded', 'browsingContext.contextDestroyed'] });
  await bidi.send('script.addPreloadScript', {
    functionDeclaration: PRELOAD,
    arguments: [{ type: 'channel', value: { channel: REPORT_CHANNEL } }],
    contexts: [context],
  });
  const evaluate = async (expression: string, timeoutMs = 5000): Promise<unknown> => {
    const r = await bidi.send(
      'script.evaluate',
      { expression, target: { context }, awaitPromise: true, resultOwnership: 'none' },
      timeoutMs,
    );
    if (r.type === 'exception') {
      const details = r.exceptionDetails as { text?: string } | undefined;
      throw new Error(details?.text ?? 'the page threw');
    }
    return fromRemote(r.result);
  };
  return { bidi, context, evaluate };
}

/** A `log.entryAdded` event as one console line. */
function logLine(p: Record<string, unknown>): string {
  const text = typeof p.text === 'string' ? p.text : '';
  return p.type === 'javascript' ? `page error: ${text}` : text;
}

/**
 * Ranks as Firefox processes, one each (killing a rank ends its browser). What a Firefox rank
 * cannot do: `freeze` (WebDriver BiDi has no page-lifecycle freeze) and `hide` (--tabs only).
 */
export function firefoxDriver(log: (line: string) => void): RankDriver {
  /** Every Firefox this driver started, killed ranks included: close() waits until all are gone. */
  const started = new Set<FirefoxInstance>();
  let announced = false;
  /** Set by close(): the ranks' browsers go away on purpose, which is no crash. */
  let closingAll = false;
  return {
    name: 'firefox',
    async newRank(h: RankHandlers): Promise<RankTarget> {
      let closingRank = false;
      const closing = () => closingRank || closingAll;
      const ff = await launchFirefox({
        onEvent: (e) => {
          if (e.method === 'script.message' && e.params.channel === REPORT_CHANNEL) {
            const data = e.params.data as { type?: string; value?: unknown } | undefined;
            if (data?.type !== 'string' || typeof data.value !== 'string') return;
            let report: Report;
            try {
              report = JSON.parse(data.value) as Report;
            } catch {
              return;
            }
            h.onReport(report);
          } else if (e.method === 'log.entryAdded') {
            h.onConsole(logLine(e.params));
          } else if (e.method === 'browsingContext.contextDestroyed' && !e.params.parent && !closing()) {
            closingRank = true;
            h.onCrash("the Firefox rank's tab went away");
          } else if (e.method === '__closed' && !closing()) {
            closingRank = true;
            h.onCrash("Firefox's WebDriver BiDi connection closed");
          }
        },
        onExit: (how) => {
          if (!closing()) h.onCrash(how);
          closingRank = true;
        },
      });
      started.add(ff);
      if (!announced) {
        announced = true;
        log(`[launch] Firefox ranks: ${firefoxPath()} (one process, fresh profile and Xvfb screen each, driven over WebDriver BiDi)`);
      }
      log(`[launch] Firefox started: process group ${ff.pid}, profile ${ff.profileDir}`);
      return {
        open: async (url) => {
          const r = await ff.bidi.send('browsingContext.navigate', { context: ff.context, url, wait: 'complete' }, 60_000);
          if (typeof r.url === 'string' && r.url.startsWith('about:neterror'))
            throw new Error(`Firefox could not open the rank's page (${r.url.split('&')[0]})`);
        },
        kill: async () => {
          closingRank = true;
          ff.bidi.close();
          ff.kill();
        },
        freeze: async () => {
          throw new Error('--freeze needs a Chromium rank: WebDriver BiDi has no page-lifecycle freeze for a Firefox rank');
        },
        hide: async () => {
          throw new Error('--hide needs --tabs (Chromium): a Firefox rank is a window of its own, never in the background');
        },
        loseDevice: async () => checkDeviceLost(await ff.evaluate(LOSE_DEVICE_EXPRESSION)),
        visibility: async () => String(await ff.evaluate('document.visibilityState').catch((e: Error) => `error: ${e.message}`)),
        timerProbe: async () => undefined,
      };
    },
    async close(): Promise<void> {
      closingAll = true;
      const all = [...started];
      for (const ff of all) {
        ff.bidi.close();
        ff.kill();
      }
      // SIGTERM, then SIGKILL after 2 s: a process group is gone well within 5 s.
      for (let i = 0; i < 50 && all.some((ff) => !ff.exited()); i++) await sleep(100);
      const left = all.filter((ff) => !ff.exited()).map((ff) => ff.pid);
      if (left.length > 0) log(`[launch] Firefox process group(s) ${left.join(', ')} still there 5 s after they were killed`);
    },
  };
}
