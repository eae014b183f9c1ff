/**
 * The Worker a DataParallel device runs in (browser builds: Vite bundles it from
 * `new Worker(new URL('./worker.js', import.meta.url))` in data_parallel.ts). Its own TF.js with
 * every backend a Worker can run: webgpu where the browser offers `navigator.gpu` to Workers,
 * webgl through OffscreenCanvas, wasm (binaries from this server), cpu.
 */
import '@tensorflow/tfjs-backend-webgpu';
import '../../runtime/wasm_paths.ts';
import { DeviceReplica } from './replica.ts';
import type { FromDevice } from './protocol.ts';

interface WorkerScope {
  postMessage(message: FromDevice, transfer: Transferable[]): void;
  onmessage: ((e: MessageEvent) => void) | null;
}
const scope = self as unknown as WorkerScope;

const replica = new DeviceReplica(
  (message, transfer = []) => scope.postMessage(message, transfer),
  (backend) => {
    if (backend === 'webgpu' && !('gpu' in navigator))
      return 'no WebGPU in this Worker (navigator.gpu is missing: this browser offers WebGPU to pages only, or not at all)';
    if (backend === 'webgl' && typeof OffscreenCanvas === 'undefined') return 'no WebGL in this Worker (OffscreenCanvas is missing)';
    return undefined;
  },
);
scope.onmessage = (e) => void replica.receive(e.data);
