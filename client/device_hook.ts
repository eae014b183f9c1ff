/**
 * The launcher's `--lose-device RANK@STEP`: `window.__ddpLoseDevice()` destroys this tab's WebGPU
 * device, which loses it as a driver reset would. Only a page's own scripts (and the launcher,
 * through DevTools) can call it, and they could destroy the device anyway.
 */
import * as tf from '@tensorflow/tfjs';
import { destroyDevice } from '../src/index.ts';

/** What __ddpLoseDevice answers when it destroyed the device. */
export const DEVICE_DESTROYED = 'destroyed';

declare global {
  interface Window {
    /** Destroys the WebGPU device; answers DEVICE_DESTROYED, or why there was none to destroy. */
    __ddpLoseDevice?: () => string;
  }
}

export function installDeviceLossHook(): void {
  window.__ddpLoseDevice = () => (destroyDevice() ? DEVICE_DESTROYED : `this tab has no WebGPU device to lose: it runs on the ${tf.getBackend()} backend`);
}
