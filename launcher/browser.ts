/** Debian's Chromium with the flags headless ranks need (see PLATFORM.md). */
import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';
import { spkiSha256 } from '../signaling/tls.ts';

export function chromiumPath(): string {
  const path = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
  if (!existsSync(path)) {
    throw new Error(`Chromium not found at ${path}: install Debian's package (apt-get install -y chromium) or set CHROMIUM_PATH`);
  }
  return path;
}

/**
 * Chromium keeps only the last --disable-features and --enable-features it is given, and the
 * args below come after Playwright's own: its lists (playwright-core 1.64's chromiumSwitches) are
 * restated here, or they would be lost.
 */
const PLAYWRIGHT_DISABLED_FEATURES = [
  'AimEnabled',
  'AvoidCorsURLLoaderRestartOnRedirect',
  'AvoidUnnecessaryBeforeUnloadCheckSync',
  'DestroyProfileOnBrowserClose',
  'HttpsFirstBalancedModeAutoEnable',
  'HttpsUpgrades',
  'LensOverlay',
  'MediaRouter',
  'NetworkTimeServiceQuerying',
  'OptimizationHints',
  'PaintHolding',
  'PreconnectToSearch',
  'TcpPortRandomizationWin',
  'ThirdPartyStoragePartitioning',
  'msEdgeUpdateLaunchServicesPreferredVersion',
  'msForceBrowserSignIn',
];
const PLAYWRIGHT_ENABLED_FEATURES = ['CDPScreenshotNewSurface', 'SkipListAccountsWithoutGaiaCookies'];
/**
 * The omnibox popup's WebUI: Chromium 156 preloads it in a renderer of its own at every start,
 * headless too (about 1.5 CPU-seconds a launch, a tenth of a churn run's CPU), for a popup no rank
 * shows (test/e2e/mixed_fleet.spec.ts checks it is gone).
 */
const OMNIBOX_WEBUI = ['WebUIOmniboxPopup', 'WebUIOmniboxAimPopup'];

/** The flags of a headless rank; `webgpu: false` for a Chromium without WebGPU (a fleet's WebGL tab). */
export function chromiumArgs({ webgpu = true }: { webgpu?: boolean } = {}): string[] {
  return [
    '--no-sandbox',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-timer-throttling',
    '--disable-renderer-backgrounding',
    '--disable-backgrounding-occluded-windows',
    // WebGPU without a GPU: SwiftShader through Vulkan.
    ...(webgpu ? ['--enable-unsafe-webgpu', '--use-webgpu-adapter=swiftshader'] : []),
    `--enable-features=${[...PLAYWRIGHT_ENABLED_FEATURES, ...(webgpu ? ['Vulkan'] : [])].join(',')}`,
    `--disable-features=${[...PLAYWRIGHT_DISABLED_FEATURES, ...OMNIBOX_WEBUI, ...(webgpu ? [] : ['WebGPU'])].join(',')}`,
  ];
}

export const CHROMIUM_ARGS = chromiumArgs();

/** `extraArgs`: e.g. `trustArgs(cert)` for a server with a self-signed certificate. */
export function launchChromium(extraArgs: readonly string[] = []): Promise<Browser> {
  return chromium.launch({ executablePath: chromiumPath(), args: [...CHROMIUM_ARGS, ...extraArgs], headless: true });
}

/**
 * Chromium args that make it accept exactly this certificate's public key for https and wss,
 * not any certificate (as --ignore-certificate-errors would). Chromium honours the flag only
 * with a --user-data-dir, which Playwright always passes.
 */
export function trustArgs(cert: string | Buffer): string[] {
  return [`--ignore-certificate-errors-spki-list=${spkiSha256(cert)}`];
}
