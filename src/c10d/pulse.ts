/**
 * A member's pulse (signaling/pulse.ts): a dedicated Worker that opens its own socket to the
 * server, presents the member's key and beats every `everyMs`. A Worker has its own thread: it
 * beats on while the page's main thread is busy (a long step on the cpu backend, a loaded laptop)
 * and sends no heartbeat, so the server takes the page for busy rather than frozen. A frozen tab
 * or a sleeping computer stops its Workers too. In Node a worker thread does the same (opt-in:
 * StoreClientOptions.pulse). What starts nothing (no Worker, a strict CSP) returns undefined: the
 * member is then judged on its heartbeats alone, as before.
 */

/** The browser Worker's script. Fixed text: the URL and key arrive as a message, never as code. */
const BROWSER_SCRIPT = `let ws, timer;
onmessage = (e) => {
  const d = e.data;
  ws = new WebSocket(d.url);
  ws.onopen = () => {
    ws.send(d.key);
    timer = setInterval(() => { if (ws.readyState === 1) ws.send('.'); }, d.everyMs);
  };
  ws.onclose = () => clearInterval(timer);
};`;

/** The Node worker thread's script: `ws` (the path resolved by the caller) as the socket. */
const NODE_SCRIPT = `const { workerData: d } = require('node:worker_threads');
const { WebSocket } = require(d.ws);
const ws = d.ca === undefined ? new WebSocket(d.url) : new WebSocket(d.url, { ca: d.ca });
let timer;
ws.on('error', () => {});
ws.on('open', () => {
  ws.send(d.key);
  timer = setInterval(() => { if (ws.readyState === 1) ws.send('.'); }, d.everyMs);
});
ws.on('close', () => clearInterval(timer));`;

export interface PulseOptions {
  /** The pulse socket's URL (the store's socket URL with `?pulse`). */
  url: string;
  /** The member's key, from its `pulse` request. */
  key: string;
  everyMs: number;
  /** Node only: certificates to trust (StoreClientOptions.ca). */
  ca?: string | Uint8Array | ReadonlyArray<string | Uint8Array>;
}

/** Whether this runtime has a browser Worker to beat from. */
export function browserPulseAvailable(): boolean {
  return (
    typeof (globalThis as { Worker?: unknown }).Worker === 'function' &&
    typeof Blob !== 'undefined' &&
    typeof URL.createObjectURL === 'function'
  );
}

/** Starts the pulse; returns what stops it (the Worker ends, its socket closes), or undefined when none could start. */
export async function startPulse(options: PulseOptions): Promise<(() => void) | undefined> {
  const message = { url: options.url, key: options.key, everyMs: Math.max(10, Math.floor(options.everyMs)) };
  if (browserPulseAvailable()) {
    try {
      const url = URL.createObjectURL(new Blob([BROWSER_SCRIPT], { type: 'text/javascript' }));
      const worker = new Worker(url);
      URL.revokeObjectURL(url);
      worker.postMessage(message);
      return () => worker.terminate();
    } catch {
      return undefined;
    }
  }
  return startNodePulse({ ...message, ...(options.ca === undefined ? {} : { ca: options.ca }) });
}

async function startNodePulse(data: {
  url: string;
  key: string;
  everyMs: number;
  ca?: PulseOptions['ca'];
}): Promise<(() => void) | undefined> {
  // Specifiers in variables: a browser bundle never loads these (and its bundler leaves them be).
  const threadsName = 'node:worker_threads';
  const moduleName = 'node:module';
  try {
    const { Worker: NodeWorker } = (await import(/* @vite-ignore */ threadsName)) as typeof import('node:worker_threads');
    const { createRequire } = (await import(/* @vite-ignore */ moduleName)) as typeof import('node:module');
    const ws = createRequire(import.meta.url).resolve('ws');
    const worker = new NodeWorker(NODE_SCRIPT, { eval: true, workerData: { ...data, ws } });
    worker.on('error', () => {});
    // The pulse must not keep a process alive that has nothing else to do.
    worker.unref();
    return () => void worker.terminate();
  } catch {
    return undefined;
  }
}
