/**
 * `npm start [-- --https] [--model DIR] [--data DIR|FILE.csv|FILE.txt [--label COLUMN]]`: build the page if
 * needed, then serve it and the store on one port; --model and --data offer the host's own model
 * and data to the sessions (signaling/offer.ts).
 */
import { parseArgs } from 'node:util';
import { ensureBuilt } from './build.ts';
import { OfferError, readOffer, type OfferFiles } from './offer.ts';
import { ServerStartError, startServer, type RunningServer } from './server.ts';
import { startupLines } from './network.ts';
import { LivenessConfigError, livenessBoundsFromEnv } from './pulse.ts';
import { tlsFromEnv, trustLines } from './tls.ts';
import { parseStoreUrl, StoreUrlError } from './engine_store.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { DEMO_PRESET, sessionUrl } from '../client/ui/session_link.ts';

const USAGE =
  "npm start takes --https (serve https with a self-signed or TLS_CERT/TLS_KEY certificate), --model DIR (a TF.js Layers model: model.json and its weight files), --data DIR|FILE.csv|FILE.txt (images in one sub-folder per class, a CSV, or a text for the language model) --label COLUMN (the CSV's label column; default the last) and --store redis://:PASSWORD@HOST:PORT (a Redis shared by several servers; default: this server's memory); PORT, HOST, HEARTBEAT_TIMEOUT_MS and BUSY_TIMEOUT_MS are set in the environment";
let values: { https?: boolean; model?: string; data?: string; label?: string; store?: string };
try {
  ({ values } = parseArgs({
    args: process.argv.slice(2),
    options: {
      https: { type: 'boolean' },
      model: { type: 'string' },
      data: { type: 'string' },
      label: { type: 'string' },
      store: { type: 'string' },
    },
    allowPositionals: false,
  }));
} catch (err) {
  console.error(`${(err as Error).message}: ${USAGE}`);
  process.exit(2);
}
const offer = {
  ...(values.model ? { modelDir: values.model } : {}),
  ...(values.data ? { dataPath: values.data } : {}),
  ...(values.label ? { labelColumn: values.label } : {}),
};

let server: RunningServer;
let tls: Awaited<ReturnType<typeof tlsFromEnv>>;
let offered: OfferFiles;
try {
  // Before the build: bad liveness bounds (HEARTBEAT_TIMEOUT_MS, BUSY_TIMEOUT_MS) should not wait for it.
  const liveness = livenessBoundsFromEnv(process.env);
  // Nor should a bad certificate or key.
  tls = await tlsFromEnv(values.https === true);
  // Nor a --store that is no Redis URL (an engine that does not answer is found by startServer).
  if (values.store !== undefined) parseStoreUrl(values.store);
  // So is bad data: read and checked here, and handed to the server as it is.
  offered = await readOffer(offer);
  await ensureBuilt();
  server = await startServer({ ...(tls ? { tls } : {}), offer: offered, ...liveness, ...(values.store ? { store: values.store } : {}) });
} catch (err) {
  // A taken port, a bad HOST or certificate is the user's to fix: the message says how; a stack would bury it.
  if (
    !(err instanceof ServerStartError) &&
    !(err instanceof OfferError) &&
    !(err instanceof LivenessConfigError) &&
    !(err instanceof StoreUrlError)
  )
    throw err;
  console.error(err.message);
  process.exit(1);
}
// A ready session link; its #token=... is the session's secret: whoever has the link can join.
const demoSession = `demo-${newSessionToken().slice(0, 6)}`;
const demoToken = newSessionToken();
// Created now, so that the link works from any tab that opens it first.
await server.createSession(demoSession, demoToken);
// The create form's Quick demo: three tabs train a short run together (it starts once two joined).
const demo = sessionUrl(server.url, { ...DEMO_PRESET, session: demoSession }, demoToken);
for (const line of startupLines(server, demo)) console.log(line);
const { model, data } = server.offered as {
  model: { name: string; inputShape: number[]; parameters: number } | null;
  data: { kind: string; name: string; length: number; classes: string[] | number } | null;
};
if (model)
  console.log(
    `Offering your model ${model.name}: input [${model.inputShape.join(', ')}], ${model.parameters} parameters (the create form's model "user")`,
  );
if (data)
  console.log(
    `Offering your data ${data.name}: ${data.length} ${data.kind === 'images' ? 'images' : 'rows'}, ${Array.isArray(data.classes) ? `classes ${data.classes.join(', ')}` : `${data.classes} classes`} (the create form's dataset "user")`,
  );
// The built-in models take one grey channel: say so before a user wonders where the colour went.
if (data?.kind === 'images')
  console.log(
    `  the built-in models (mlp, cnn) see them as 28x28 grey images (luminance, values 0..1); only your own model (--model DIR, input [H, W, 3]) keeps colour`,
  );
if (tls) for (const line of trustLines(tls)) console.log(line);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    void server.close().then(() => process.exit(0));
  });
}
