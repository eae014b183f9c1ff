/**
 * src/runtime/device.ts where no WebGPU device exists (Node, TF.js cpu backend): watching is a no-op,
 * and re-creating the backend falls back, saying why. The WebGPU paths (a device destroyed, the
 * backend re-created on a new one) run on real pages in test/e2e/device_lost.spec.ts.
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { currentDevice, destroyDevice, probeBackend, recreateBackend, watchDevice } from '../src/runtime/device.ts';
import { DeviceLostError, isRecoverable } from '../src/wire/errors.ts';
import { sleep } from './fixtures/wait.ts';

beforeAll(async () => {
  await tf.setBackend('cpu');
});

describe('device', () => {
  it('on a backend without a device, the watch never fires and there is nothing to destroy', async () => {
    const watch = watchDevice();
    expect(watch.backend).toBe('cpu');
    expect(currentDevice()).toBeUndefined();
    expect(destroyDevice()).toBe(false);
    let heard = false;
    watch.onLost(() => (heard = true));
    // "Never fires" has no event to wait for: 50 ms is as long as the test can afford to watch.
    const settled = await Promise.race([watch.lost.then(() => 'lost'), sleep(50).then(() => 'pending')]);
    expect(settled).toBe('pending');
    expect(heard).toBe(false);
    expect(watch.isLost()).toBe(false);
    watch.stop();
  });

  it('without a webgpu backend to re-create, recreateBackend falls back and says why', async () => {
    const r = await recreateBackend({ fallbacks: ['cpu'] });
    expect(r.backend).toBe('cpu');
    expect(r.fallbackReason).toContain('the webgpu backend was never registered');
    expect(tf.getBackend()).toBe('cpu');
    expect(await probeBackend()).toBeUndefined();
  });

  it('when no backend can start, recreateBackend throws DeviceLostError naming each reason', async () => {
    const err = await recreateBackend({ fallbacks: ['no-such-backend'], rank: 2, during: 'step 9' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DeviceLostError);
    expect((err as DeviceLostError).rank).toBe(2);
    expect((err as DeviceLostError).message).toContain('during step 9');
    expect((err as DeviceLostError).message).toContain('No TF.js backend could start again');
  });

  it('DeviceLostError says what happened and what to do; by itself a new round cannot fix it', () => {
    const e = new DeviceLostError(1, 'unknown', 'GPU reset', 'step 12');
    expect(e.name).toBe('DeviceLostError');
    expect(e.message).toBe(
      `rank 1's WebGPU device was lost during step 12: the GPU was reset or taken away (a driver crash or update, the computer switching graphics cards, or too little GPU memory); the browser said "GPU reset". Every tensor on that device is gone. Reload the page to rejoin the session with a new device (runElastic rejoins by itself when given rebuildState).`,
    );
    expect(isRecoverable(e)).toBe(false);
    expect(new DeviceLostError(-1, 'destroyed', 'x', 'evaluation').message).toMatch(
      /^this tab's WebGPU device was lost during evaluation: the page destroyed it/,
    );
  });
});
