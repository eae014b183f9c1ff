/**
 * Where TF.js's wasm backend finds its binaries in a Vite build: the three .wasm files emitted as
 * assets of the bundle (no CDN: nothing is fetched from off this server). Imported for its effect
 * by the page (client/train/backend.ts) and by DataParallel's Worker; browser builds only (the `?url`
 * imports are Vite's), so src/index.ts does not import it.
 */
import { setWasmPaths } from '@tensorflow/tfjs-backend-wasm';
import wasmPlain from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm.wasm?url';
import wasmSimd from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-simd.wasm?url';
import wasmThreadedSimd from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-threaded-simd.wasm?url';

setWasmPaths({
  'tfjs-backend-wasm.wasm': wasmPlain,
  'tfjs-backend-wasm-simd.wasm': wasmSimd,
  'tfjs-backend-wasm-threaded-simd.wasm': wasmThreadedSimd,
});
