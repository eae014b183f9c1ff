/**
 * Test hooks a launcher or test reaches through DevTools, as a fault would strike:
 * - `window.__ddpLoseDevice()` (the launcher's `--lose-device RANK@STEP`) destroys this tab's
 *   WebGPU device, which loses it as a driver reset would;
 * - `window.__ddpFailDevice(device, kind)` makes one of this tab's DataParallel devices (--devices)
 *   crash or hang, as a Worker that dies would.
 * Only a page's own scripts (and the launcher, through DevTools) can call them, and they could
 * destroy the device or terminate the Workers anyway.
 */
import * as tf from '@tensorflow/tfjs';
import type { DataParallel } from '../src/index.ts';
import { destroyDevice } from '../src/runtime/device.ts';
import type { DeviceFault } from '../src/parallel/data_parallel/protocol.ts';

/** What __ddpLoseDevice answers when it destroyed the device. */
export const DEVICE_DESTROYED = 'destroyed';
/** What __ddpFailDevice answers when the fault went to the device. */
export const DEVICE_FAULT_SENT = 'sent';

declare global {
  interface Window {
    /** Destroys the WebGPU device; answers DEVICE_DESTROYED, or why there was none to destroy. */
    __ddpLoseDevice?: () => string;
    /** Makes DataParallel device `device` crash or hang; answers DEVICE_FAULT_SENT, or why it could not. */
    __ddpFailDevice?: (device: number, kind: DeviceFault) => string;
  }
}

/** The DataParallel this tab trains with (--devices), for __ddpFailDevice. */
let active: DataParallel | undefined;

export function setActiveDataParallel(dp: DataParallel | undefined): void {
  active = dp;
}

export function installDeviceLossHook(): void {
  window.__ddpLoseDevice = () =>
    destroyDevice() ? DEVICE_DESTROYED : `this tab has no WebGPU device to lose: it runs on the ${tf.getBackend()} backend`;
  window.__ddpFailDevice = (device, kind) => {
    if (!active) return 'this tab has no DataParallel devices (it trains with --devices 1, or has not started)';
    try {
      active.injectFault(device, kind);
      return DEVICE_FAULT_SENT;
    } catch (err) {
      return (err as Error).message;
    }
  };
}
