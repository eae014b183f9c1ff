/** What this tab's WebGPU adapter is, or why there is none. */
export interface WebGpuProbe {
  available: boolean;
  /** e.g. "google swiftshader" or "nvidia ampere". */
  adapter: string | null;
  reason?: string;
}

interface AdapterInfoLike {
  vendor?: string;
  architecture?: string;
  device?: string;
  description?: string;
}

/**
 * Why WebGPU is missing on a plain-http page from another machine: browsers offer it only to
 * secure pages, so the browser is not to blame and another browser would not help.
 */
export const INSECURE_PAGE_REASON = 'WebGPU needs a secure page (https, or localhost)';

/** Why this page has no `navigator.gpu`, or undefined when it has one. */
export function missingWebGpuReason(): string | undefined {
  if (!window.isSecureContext) return INSECURE_PAGE_REASON;
  if (!(navigator as unknown as { gpu?: unknown }).gpu) return 'this browser has no WebGPU (navigator.gpu is missing)';
  return undefined;
}

export async function probeWebGpu(): Promise<WebGpuProbe> {
  const gpu = (navigator as unknown as { gpu?: { requestAdapter(): Promise<{ info?: AdapterInfoLike } | null> } }).gpu;
  const missing = missingWebGpuReason();
  if (missing !== undefined || !gpu) return { available: false, adapter: null, reason: missing };
  try {
    const adapter = await gpu.requestAdapter();
    if (!adapter) return { available: false, adapter: null, reason: 'WebGPU found no adapter (no usable GPU or driver)' };
    const info = adapter.info ?? {};
    const name = [info.vendor, info.architecture || info.device || info.description].filter(Boolean).join(' ');
    return { available: true, adapter: name || 'unknown adapter' };
  } catch (err) {
    return { available: false, adapter: null, reason: `requesting a WebGPU adapter failed: ${(err as Error).message}` };
  }
}
