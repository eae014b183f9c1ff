/**
 * The launcher's browsers per rank (--browser, --browsers; launcher/rank_browsers.ts) and the
 * Firefox profile's preferences (launcher/firefox.ts): the pure checks, launch()'s own checks, and
 * the command line's exit code 2 with the message before anything starts. The Firefox ranks
 * themselves are tested end to end in test/e2e/firefox.spec.ts.
 */
import { describe, expect, it } from 'vitest';
import { FIREFOX_PREFS, userJs } from '../launcher/firefox.ts';
import { firefoxProblems, opensIn, parseBrowsers, usesFirefox } from '../launcher/rank_browsers.ts';
import { describeFault, launch } from '../launcher/run.ts';
import { refusalLine, runLauncher } from './fixtures/launch_cli.ts';

describe('parseBrowsers', () => {
  it('--browser B: every rank and every joining page in B; neither flag: no plan (all Chromium)', () => {
    expect(parseBrowsers('firefox', undefined, 3)).toEqual({ ranks: ['firefox', 'firefox', 'firefox'], join: 'firefox' });
    expect(parseBrowsers('chromium', undefined, 1)).toEqual({ ranks: ['chromium'], join: 'chromium' });
    expect(parseBrowsers(undefined, undefined, 4)).toBeUndefined();
  });

  it('--browsers: one per rank, in rank order; pages opened by --join are Chromium', () => {
    expect(parseBrowsers(undefined, 'chromium,firefox,chromium', 3)).toEqual({
      ranks: ['chromium', 'firefox', 'chromium'],
      join: 'chromium',
    });
    expect(parseBrowsers(undefined, ' firefox , chromium', 2)).toEqual({ ranks: ['firefox', 'chromium'], join: 'chromium' });
  });

  it('refuses a list of the wrong length, an unknown browser and both flags at once, saying what to give', () => {
    expect(() => parseBrowsers(undefined, 'chromium,firefox', 3)).toThrow(
      '--browsers gives 2 browsers but --nproc is 3: give one per rank (e.g. --browsers chromium,firefox,chromium)',
    );
    expect(() => parseBrowsers(undefined, 'firefox', 2)).toThrow('--browsers gives 1 browser but --nproc is 2');
    expect(() => parseBrowsers(undefined, 'chromium,safari', 2)).toThrow(
      '--browsers takes chromium or firefox for each rank, comma-separated (e.g. --browsers chromium,firefox), got "safari"',
    );
    expect(() => parseBrowsers(undefined, 'chromium,,firefox', 3)).toThrow('got ""');
    expect(() => parseBrowsers('webkit', undefined, 2)).toThrow('--browser must be chromium or firefox, got "webkit"');
    expect(() => parseBrowsers('firefox', 'firefox,chromium', 2)).toThrow(
      'give --browser B (every rank) or --browsers B0,B1,... (one per rank), not both',
    );
  });

  it('says which browsers a plan opens', () => {
    const mixed = parseBrowsers(undefined, 'chromium,firefox', 2);
    expect(usesFirefox(mixed)).toBe(true);
    expect(usesFirefox(undefined)).toBe(false);
    expect(usesFirefox(parseBrowsers('chromium', undefined, 2))).toBe(false);
    expect(opensIn(mixed, 'chromium') && opensIn(mixed, 'firefox')).toBe(true);
    expect(opensIn(undefined, 'chromium')).toBe(true);
    expect(opensIn(undefined, 'firefox')).toBe(false);
  });
});

describe('firefoxProblems', () => {
  const firefox = parseBrowsers('firefox', undefined, 2);
  it('Firefox ranks are not tabs of the headful Chromium, not hosts of the virtual LAN, and do not trust a self-signed server yet', () => {
    expect(firefoxProblems(firefox, {})).toEqual([]);
    expect(firefoxProblems(firefox, { tabs: true })[0]).toMatch(/^--tabs runs every rank as a tab of one headful Chromium/);
    expect(firefoxProblems(firefox, { lan: true })[0]).toMatch(/^--lan runs every rank as a Chromium/);
    expect(firefoxProblems(firefox, { https: true })[0]).toMatch(/^Firefox ranks cannot trust a self-signed certificate yet/);
    expect(firefoxProblems(firefox, { server: 'https://192.168.1.5:8443/' })).toHaveLength(1);
    // Chromium-only plans combine with everything.
    expect(firefoxProblems(parseBrowsers('chromium', undefined, 2), { tabs: true, lan: true, https: true })).toEqual([]);
  });
});

describe('the Firefox profile', () => {
  it('user.js turns off first-run pages, telemetry, updates and background networking', () => {
    const js = userJs();
    for (const line of [
      'user_pref("browser.aboutwelcome.enabled", false);',
      'user_pref("browser.shell.checkDefaultBrowser", false);',
      'user_pref("toolkit.telemetry.enabled", false);',
      'user_pref("datareporting.policy.dataSubmissionEnabled", false);',
      'user_pref("app.update.disabledForTesting", true);',
      'user_pref("extensions.update.enabled", false);',
      'user_pref("network.captive-portal-service.enabled", false);',
      'user_pref("browser.safebrowsing.malware.enabled", false);',
      'user_pref("services.settings.server", "data:,#remote-settings-dummy/v1");',
    ]) {
      expect(js).toContain(line);
    }
    expect(js.trim().split('\n')).toHaveLength(Object.keys(FIREFOX_PREFS).length);
  });
});

describe('launch() with browsers', () => {
  const opts = { nproc: 2, job: 'train', session: 's', timeoutSec: 5, jobParams: {}, log: () => {} };
  it('checks the plan against the run before anything starts', async () => {
    await expect(launch({ ...opts, browsers: parseBrowsers('firefox', undefined, 2), tabs: true })).rejects.toThrow(
      /^--tabs runs every rank as a tab/,
    );
    await expect(
      launch({ ...opts, jobParams: { min: '1', max: '3' }, faults: [{ kind: 'kill', rank: 'firefox', step: 3 }] }),
    ).rejects.toThrow('kill the firefox rank at step 3: no rank of this run opens in firefox (give --browser or --browsers with it)');
  });

  it('names a browser target in its fault', () => {
    expect(describeFault({ kind: 'kill', rank: 'firefox', step: 5 })).toBe('kill the firefox rank at step 5');
    expect(describeFault({ kind: 'kill', rank: 1, step: 5 })).toBe('kill rank 1 at step 5');
    expect(describeFault({ kind: 'lose-device', rank: 'chromium', step: 2 })).toBe("lose the chromium rank's WebGPU device at step 2");
  });
});

describe('npm run launch -- --browser / --browsers', () => {
  it('exits 2 with the message before starting anything', { timeout: 60_000 }, () => {
    const cases: Array<[string[], string]> = [
      [
        ['--nproc', '3', '--job', 'train', '--browsers', 'chromium,firefox'],
        '--browsers gives 2 browsers but --nproc is 3: give one per rank (e.g. --browsers chromium,firefox,chromium)',
      ],
      [['--nproc', '2', '--job', 'train', '--browser', 'safari'], '--browser must be chromium or firefox, got "safari"'],
      [
        ['--nproc', '2', '--job', 'train', '--browser', 'firefox', '--browsers', 'firefox,firefox'],
        'give --browser B (every rank) or --browsers B0,B1,... (one per rank), not both',
      ],
      [
        ['--nproc', '2', '--job', 'train', '--browser', 'firefox', '--tabs'],
        '--tabs runs every rank as a tab of one headful Chromium: drop --tabs for Firefox ranks',
      ],
      [
        ['--nproc', '2', '--job', 'train', '--min', '1', '--max', '3', '--kill', 'firefox@3'],
        '--kill firefox@3: no rank opens in firefox (give --browser firefox or --browsers with it)',
      ],
      [
        ['--nproc', '2', '--job', 'train', '--min', '1', '--max', '3', '--kill', 'safari@3'],
        '--kill takes RANK@STEP or BROWSER@STEP (chromium, firefox), got "safari@3"',
      ],
    ];
    // The real command for the first (its exit code, stderr and empty stdout); the parser it calls for the rest.
    const [[firstArgs, firstMessage], ...rest] = cases;
    const r = runLauncher(...firstArgs!);
    expect(r.stderr.split('\n')[0], firstArgs!.join(' ')).toBe(firstMessage);
    expect(r.status).toBe(2);
    expect(r.stdout).toBe('');
    for (const [args, message] of rest) expect(refusalLine(...args), args.join(' ')).toBe(message);
  });
});
