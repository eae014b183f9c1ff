/**
 * `runtime`: the page's TF.js backend and WebGPU device (watch it, lose it, re-create it), and
 * the launcher's simulated stragglers (`--slow`).
 */
export {
  watchDevice,
  recreateBackend,
  destroyDevice,
  currentDevice,
  probeBackend,
  startBackend,
  disposeQuietly,
  type DeviceWatch,
  type DeviceLostInfo,
  type GpuDeviceLike,
  type RecreatedBackend,
  type RecreateBackendOptions,
} from './runtime/device.ts';
export { Straggler, StragglerSpecError, parseSlow, formatSlow, slowFactor, SLOW_SPEC_RULE } from './runtime/straggler.ts';
