/**
 * The `--lan` rank driver: each rank is a headless Chromium of its own, started inside its own
 * host namespace of the virtual LAN (launcher/lan.ts) through a wrapper script as Playwright's
 * `executablePath`. A host (namespace, address, shaped link) is made per rank on demand, so a
 * `--join` fault gets a new one too.
 *
 * The page comes from http://10.A.B.1:PORT, which is not a secure context, and WebGPU exists only
 * in secure contexts: for an http origin each Chromium gets
 * `--unsafely-treat-insecure-origin-as-secure=<origin>` (logged once). For an https origin no such
 * flag is added; `extraArgs` go to every rank's Chromium (the hook for --https: e.g. the flags
 * that make Chromium trust the run's certificate).
 */
import { chromium, type Browser } from 'playwright-core';
import { CHROMIUM_ARGS, chromiumPath } from './browser.ts';
import { playwrightRank, type RankDriver, type RankHandlers, type RankTarget } from './driver.ts';
import type { Lan } from './lan.ts';

export interface LanDriverOptions {
  log: (line: string) => void;
  /** More Chromium flags for every rank's browser. */
  extraArgs?: readonly string[];
}

/** The flags that make the server's origin a secure context for this Chromium (none for https). */
export function secureOriginArgs(origin: string): string[] {
  return new URL(origin).protocol === 'https:' ? [] : [`--unsafely-treat-insecure-origin-as-secure=${origin}`];
}

export function lanDriver(lan: Lan, o: LanDriverOptions): RankDriver {
  const browsers = new Set<Browser>();
  const executable = chromiumPath();
  let warned = false;
  return {
    name: 'lan',
    async newRank(h: RankHandlers): Promise<RankTarget> {
      const host = await lan.addHost();
      o.log(`[launch] lan: host ${host.index} in namespace ${host.namespace} at ${host.address}, link ${host.rateMbit} Mbit/s each way`);
      let browser: Browser | undefined;
      let target: Awaited<ReturnType<typeof playwrightRank>> | undefined;
      const notOpen = () => new Error(`the rank's page on ${host.address} is not open`);
      return {
        host,
        // The browser starts here: its flags depend on the server's origin.
        open: async (url) => {
          const origin = new URL(url).origin;
          const secure = secureOriginArgs(origin);
          if (secure.length > 0 && !warned) {
            warned = true;
            o.log(
              `[launch] lan: ${origin} is plain http, not a secure context: each rank's Chromium treats it as secure (${secure[0]}) so that WebGPU is there`,
            );
          }
          browser = await chromium.launch({
            executablePath: lan.chromiumWrapper(host, executable),
            args: [...CHROMIUM_ARGS, ...secure, ...(o.extraArgs ?? [])],
            headless: true,
          });
          browsers.add(browser);
          browser.on('disconnected', () => {
            if (browsers.delete(browser!)) h.onCrash(`the Chromium of the host at ${host.address} went away`);
          });
          target = await playwrightRank(await browser.newPage(), h);
          await target.open(url);
        },
        // A killed rank is a host whose browser is gone (and frees its share of the cores).
        kill: async () => {
          if (!browser) throw notOpen();
          // The page first (quick, and it sends its leave notice), then its browser.
          await target?.kill();
          browsers.delete(browser);
          await browser.close();
        },
        freeze: async (log) => {
          if (!target) throw notOpen();
          await target.freeze(log);
        },
        hide: async () => {
          throw new Error('--hide needs --tabs: headless pages are never in the background');
        },
        loseDevice: async () => {
          if (!target) throw notOpen();
          await target.loseDevice();
        },
        visibility: async () => (target ? target.visibility() : 'error: not open'),
        timerProbe: async () => undefined,
      };
    },
    async close() {
      const all = [...browsers];
      browsers.clear();
      await Promise.all(all.map((b) => b.close().catch(() => {})));
    },
  };
}
