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

export const CHROMIUM_ARGS = [
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
  '--enable-unsafe-webgpu',
  '--use-webgpu-adapter=swiftshader',
  '--enable-features=Vulkan',
];

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
