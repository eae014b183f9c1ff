/** This tab's fleet info, read from the page (see fleet.ts for how it travels). */
import type { BackendChoice } from './backend.ts';
import { browserLabel, platformLabel, thisBrowser } from '../user_agent.ts';
import { FleetSharer, deviceText, type FleetEvent, type FleetGroup, type FleetInfo } from './fleet.ts';
import { deviceMemoryGB } from './preflight.ts';

/** The WebGL renderer's name (unmasked where the browser allows), or null. Only asked on the webgl backend. */
function glRenderer(): string | null {
  try {
    const gl = document.createElement('canvas').getContext('webgl2') ?? document.createElement('canvas').getContext('webgl');
    if (!gl) return null;
    const ext = gl.getExtension('WEBGL_debug_renderer_info');
    const name: unknown = gl.getParameter(ext ? ext.UNMASKED_RENDERER_WEBGL : gl.RENDERER);
    gl.getExtension('WEBGL_lose_context')?.loseContext();
    return typeof name === 'string' ? name : null;
  } catch {
    return null;
  }
}

export function localFleetInfo(backend: BackendChoice, adapter: string | null): FleetInfo {
  const b = thisBrowser();
  return {
    browser: browserLabel(b),
    platform: platformLabel(b),
    mobile: b.mobile,
    backend: backend.backend,
    device: deviceText(backend.backend, adapter, backend.backend === 'webgl' ? glRenderer() : null, navigator.hardwareConcurrency ?? null),
    fallback: backend.fallbackReason ?? null,
    memoryGB: deviceMemoryGB(),
  };
}

/**
 * What a trainer calls at each round: shares this tab's info with the group and emits the
 * group's as it comes (never throws, never holds the round up).
 */
export function fleetReporter(emit: (e: FleetEvent) => void): (group: FleetGroup, backend: BackendChoice, adapter: string | null) => void {
  const sharer = new FleetSharer();
  return (group, backend, adapter) => void sharer.share(group, localFleetInfo(backend, adapter), emit);
}
