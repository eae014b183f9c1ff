/**
 * The page a user's script runs in when the launcher starts it (torchrun's worker process): it
 * reads the launch from the URL, sets up the TF.js backend, forwards the library's elastic
 * events to the launcher, and calls the script's default export with a LaunchContext.
 */
import { fetchOffer, type LaunchContext, type ScriptMain } from '../../src/index.ts';
import { parseScriptArgs } from '../../src/jobs/launch_context.ts';
import { parseSlow } from '../../src/runtime/straggler.ts';
import { selectBackend } from '../train/backend.ts';
import { BACKENDS, type BackendName } from '../../src/jobs/train_config.ts';
import { reportElasticEvents } from '../report.ts';
import { installDeviceLossHook } from '../device_hook.ts';
import { runOnPage } from '../pages/job_page.ts';
import { pageToken } from '../page_token.ts';

function intParam(params: URLSearchParams, name: string, fallback: number): number {
  const raw = params.get(name);
  if (raw === null || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`URL parameter "${name}" must be a positive integer, got "${raw}"`);
  return n;
}

export async function runScript(main: ScriptMain, name: string): Promise<void> {
  const params = new URLSearchParams(location.search);
  reportElasticEvents();
  installDeviceLossHook();
  await runOnPage(document.getElementById('app')!, `Script ${name}`, async (page) => {
    const session = params.get('session');
    if (!session) throw new Error('URL parameter "session" is required');
    const nproc = intParam(params, 'world', 1);
    const min = intParam(params, 'min', nproc);
    const max = intParam(params, 'max', Math.max(nproc, min));
    const wanted = params.get('backend') ?? 'webgpu';
    if (!(BACKENDS as readonly string[]).includes(wanted))
      throw new Error(`--backend must be one of ${BACKENDS.join(', ')}, got "${wanted}"`);
    const backend = await selectBackend(wanted as BackendName);
    if (backend.fallbackReason) page.log(`backend fallback: ${backend.fallbackReason}`);
    const argv = params.getAll('arg');
    let slow: Record<number, number>;
    try {
      slow = parseSlow(params.get('slow') ?? '', max);
    } catch (err) {
      throw new Error(`URL parameter "slow" (--slow): ${(err as Error).message}`);
    }
    const token = pageToken();
    // What the host offers (--model-dir, --data-dir): one small request, so that a script can choose by it.
    const offer = await fetchOffer({ url: location.origin, session, token, timeoutMs: 30_000 });
    const ctx: LaunchContext = {
      url: location.origin,
      session,
      token,
      offer,
      nproc,
      min,
      max,
      timeoutMs: intParam(params, 'timeoutMs', 600_000),
      argv,
      args: parseScriptArgs(argv),
      slow,
      backend: backend.backend,
      ...(backend.fallbackReason ? { fallbackReason: backend.fallbackReason } : {}),
      log: page.log,
    };
    page.status(`running on ${backend.backend}`);
    return (await main(ctx)) ?? {};
  });
}
