/**
 * Chooses the TF.js backend: WebGPU by default, or the one the URL asks for, falling back
 * (webgpu -> webgl -> cpu) with the reason when it cannot start.
 */
import '@tensorflow/tfjs-backend-webgpu';
import '../../src/runtime/wasm_paths.ts';
import { startBackend } from '../../src/index.ts';
import { BACKENDS, type BackendName } from '../../src/jobs/train_config.ts';
import { INSECURE_PAGE_REASON, missingWebGpuReason } from '../webgpu.ts';
import { noBackendError } from './preflight.ts';

export interface BackendChoice {
  backend: BackendName;
  /** Why the backend asked for is not the one running, if it is not. */
  fallbackReason?: string;
}

async function tryBackend(name: BackendName): Promise<string | undefined> {
  if (name === 'webgpu') {
    const missing = missingWebGpuReason();
    if (missing !== undefined) return missing;
  }
  return startBackend(name);
}

export async function selectBackend(wanted: BackendName): Promise<BackendChoice> {
  if (!(BACKENDS as readonly string[]).includes(wanted)) throw new Error(`unknown backend "${wanted}"; use ${BACKENDS.join(', ')}`);
  const reasons: string[] = [];
  const order = [wanted, ...(['webgpu', 'webgl', 'cpu'] as BackendName[]).filter((b) => b !== wanted && BACKENDS.indexOf(b) > BACKENDS.indexOf(wanted))];
  for (const name of order) {
    const failure = await tryBackend(name);
    if (failure === undefined) {
      if (name === wanted) return { backend: name };
      // Plain http from another machine: say it is the page, not the browser, and how to get WebGPU.
      if (reasons[0] === INSECURE_PAGE_REASON) {
        return { backend: name, fallbackReason: `${INSECURE_PAGE_REASON}. This tab trains on ${name} meanwhile; to use WebGPU, open the session over https (see docs/deployment.md, “Across machines”)` };
      }
      return { backend: name, fallbackReason: `${reasons.join('; ')}; using ${name} instead` };
    }
    reasons.push(failure);
  }
  // Said in plain words; the tab has not joined the group yet, so the others train on without it.
  throw noBackendError(reasons);
}
