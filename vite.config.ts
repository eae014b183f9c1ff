import { defineConfig } from 'vite';

// The page (index.html + client/) is built into dist/, which the signaling server serves.
export default defineConfig({
  root: '.',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2022',
    chunkSizeWarningLimit: 4096,
    // No "[PLUGIN_TIMINGS]" report on every build: `npm start` prints only what the person needs.
    rolldownOptions: { checks: { bundlerTimings: false } },
  },
  server: {
    // `vite` dev server: proxy the store socket to a running `npm start`.
    proxy: { '/ws': { target: 'ws://127.0.0.1:8080', ws: true } },
  },
});
