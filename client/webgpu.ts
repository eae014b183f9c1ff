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

export async function probeWebGpu(): Promise<WebGpuProbe> {
  const gpu = (navigator as unknown as { gpu?: { requestAdapter(): Promise<{ info?: AdapterInfoLike } | null> } }).gpu;
  if (!window.isSecureContext) {
    return { available: false, adapter: null, reason: 'not a secure context: open the page over https or on localhost' };
  }
  if (!gpu) return { available: false, adapter: null, reason: 'this browser has no WebGPU (navigator.gpu is missing)' };
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
