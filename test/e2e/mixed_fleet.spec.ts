/**
 * A mixed fleet: a Chromium tab on WebGPU (SwiftShader) and a Chromium tab without WebGPU (it
 * falls back to WebGL, as a tab on a plain-http LAN address or an older browser does) train the
 * train job together. Before the optimizer moved to the host (src/nn/optim.ts) each tab applied the
 * averaged gradients with its own backend's arithmetic and the replicas diverged within 100 steps
 * (`ReplicaDivergenceError` at the step-100 check); now both end every step with the same bits.
 * Firefox beside Chromium is test/e2e/firefox.spec.ts.
 */
import { chromium } from 'playwright';
import { chromiumArgs, chromiumPath } from '../../launcher/browser.ts';
import { expect, openRanks, sessionName, test } from './fixtures.ts';

/** Chromium without WebGPU: the page falls back to WebGL (SwiftShader GL). */
const NO_WEBGPU_ARGS = chromiumArgs({ webgpu: false });

test('a WebGPU tab and a tab without WebGPU (WebGL) train 60 steps with identical weights at every step', async ({ browser, server }) => {
  test.setTimeout(240_000);
  const noGpu = await chromium.launch({ executablePath: chromiumPath(), args: NO_WEBGPU_ARGS, headless: true });
  try {
    const session = sessionName('mixed');
    const params = {
      session,
      job: 'train',
      dataset: 'synthetic',
      model: 'mlp',
      batchSize: '16',
      steps: '60',
      optimizer: 'adam',
      checkWeights: 'true',
      world: '2',
    };
    const [gpuRank] = await openRanks(browser, server, 1, { ...params, rank: '0' });
    const [glRank] = await openRanks(noGpu, server, 1, { ...params, rank: '1' });
    const results = await Promise.all([gpuRank!.result, glRank!.result]);
    expect(results.map((r) => r.backend)).toEqual(['webgpu', 'webgl']);
    for (const r of results) {
      expect(r.identicalEveryStep).toBe(true);
      expect(r.checkedSteps).toBe(60);
      expect(r.weightHash).toBe(results[0]!.weightHash);
    }
    // Both browsers run with the flags' one --disable-features (launcher/browser.ts): no renderer
    // of the browser's own UI (the omnibox popup it would preload), beside WebGPU on and off above.
    for (const b of [browser, noGpu]) {
      const cdp = await b.newBrowserCDPSession();
      const { targetInfos } = (await cdp.send('Target.getTargets')) as { targetInfos: Array<{ type: string; url: string }> };
      expect(targetInfos.filter((t) => t.type === 'browser_ui' || t.url.startsWith('chrome:')).map((t) => t.url)).toEqual([]);
      await cdp.detach();
    }
  } finally {
    await noGpu.close();
  }
});
