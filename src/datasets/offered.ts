/**
 * The host's own model and data, as the server offers them to a session's tabs
 * (`npm start -- --model DIR --data DIR|FILE.csv|FILE.txt`; signaling/offer.ts has the routes). Every
 * request carries the session's token. Images are decoded and resized here, in the tab, to the
 * model's input [height, width, channels] (1 channel: grey, 3: RGB; values 0..1); an image that
 * does not decode is refused naming its file.
 */
import * as tf from '@tensorflow/tfjs';
import { csvDataset } from './csv.ts';
import { DatasetError, DatasetFetchError, InMemoryDataset, product, type Dataset } from './dataset.ts';
import { StreamedDataset } from './streamed.ts';
import { topologyLayers, type WeightSpec } from '../wire/tfjs_artifacts.ts';

export interface OfferRequest {
  /** The server's origin. */
  url: string;
  session: string;
  token: string;
  fetch?: typeof fetch;
  /** Per request. Default 60 s. */
  timeoutMs?: number;
}

/** What the server offers (GET /api/offer). */
export interface OfferInfo {
  model: { name: string; inputShape: number[]; outputUnits: number; parameters: number; hash: string } | null;
  /** A text's `classes` is its vocabulary's size, its `length` its characters. */
  data: { kind: 'images' | 'csv' | 'text'; name: string; classes: string[] | number; length: number; inputShape: number[] | null } | null;
}

/** Longest wait a refusal's Retry-After may ask for between two tries (seconds). */
const MAX_RETRY_AFTER_S = 10;

/**
 * GET of an offer route with the session's token. A refusal for a full bound (429, 503: the
 * server serves so many downloads at once per address, session and server; signaling/limits.ts)
 * is tried again after its Retry-After (with jitter, so a class's tabs spread out), until
 * `timeoutMs` has passed; any other error is thrown naming the route.
 */
async function get(req: OfferRequest, path: string, what: string): Promise<Response> {
  const url = new URL(`/api/offer${path}`, req.url);
  url.searchParams.set('session', req.session);
  const timeoutMs = req.timeoutMs ?? 60_000;
  const signal = AbortSignal.timeout(timeoutMs);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const res = await (req.fetch ?? fetch)(url, { headers: { authorization: `Bearer ${req.token}` }, signal }).catch((err: Error) => {
      throw new DatasetFetchError(
        `${what}: no answer from ${url.pathname} (${err.name === 'TimeoutError' ? `nothing within ${timeoutMs} ms` : err.message})`,
        url.href,
      );
    });
    if (res.ok) return res;
    const body = (await res.json().catch(() => ({}))) as { message?: string };
    const retryAfter = Number(res.headers.get('retry-after'));
    const waitMs =
      Math.min(Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter : 1, MAX_RETRY_AFTER_S) * 1000 * (1 + Math.random() / 2);
    if ((res.status === 429 || res.status === 503) && Date.now() + waitMs < deadline) {
      await new Promise((r) => setTimeout(r, waitMs));
      continue;
    }
    throw new DatasetFetchError(
      `${what}: HTTP ${res.status} from ${url.pathname}: ${body.message ?? res.statusText}`,
      url.href,
      res.status,
    );
  }
}

export async function fetchOffer(req: OfferRequest): Promise<OfferInfo> {
  return (await (await get(req, '', 'asking the server what it offers')).json()) as OfferInfo;
}

/**
 * The offered model, with its own initial weights. A last layer with a softmax becomes linear:
 * the job's loss is softmax cross-entropy on logits, so the softmax moves into the loss and the
 * predicted class is the same. `note` says so when it happened.
 */
export async function loadOfferedModel(req: OfferRequest): Promise<{ model: tf.LayersModel; note: string | null }> {
  const what = "loading the host's model";
  const { modelTopology, weightSpecs } = (await (await get(req, '/model', what)).json()) as {
    modelTopology: Record<string, unknown>;
    weightSpecs: WeightSpec[];
  };
  const weightData = await (await get(req, '/model/weights', what)).arrayBuffer();
  const topology = structuredClone(modelTopology);
  const { layers } = topologyLayers(topology);
  const last = layers[layers.length - 1]?.config;
  let note: string | null = null;
  if (last?.activation === 'softmax') {
    last.activation = 'linear';
    note = `the model's last layer "${String(last.name)}" had a softmax: it outputs logits here, and the loss applies the softmax (softmax cross-entropy); predictions are unchanged`;
  }
  const model = await tf.loadLayersModel(
    tf.io.fromMemory({ modelTopology: topology, weightSpecs: weightSpecs as tf.io.WeightsManifestEntry[], weightData }),
  );
  return { model, note };
}

/** Decodes one image to [h, w, c] floats in 0..1 (c 1: grey by luminance, 3: RGB). */
async function decodeImage(bytes: Blob, file: string, [h, w, c]: [number, number, number], out: Float32Array, at: number): Promise<void> {
  let bitmap: ImageBitmap;
  try {
    bitmap = await createImageBitmap(bytes, { resizeWidth: w, resizeHeight: h, resizeQuality: 'high' });
  } catch (err) {
    throw new DatasetError(`image ${file} cannot be decoded (${(err as Error).message}): replace or remove it`);
  }
  const canvas = new OffscreenCanvas(w, h);
  const ctx = canvas.getContext('2d', { willReadFrequently: true })!;
  ctx.drawImage(bitmap, 0, 0, w, h);
  bitmap.close();
  const rgba = ctx.getImageData(0, 0, w, h).data;
  for (let p = 0; p < w * h; p++) {
    const [r, g, b] = [rgba[4 * p]!, rgba[4 * p + 1]!, rgba[4 * p + 2]!];
    if (c === 1) out[at + p] = (0.299 * r + 0.587 * g + 0.114 * b) / 255;
    else {
      out[at + 3 * p] = r / 255;
      out[at + 3 * p + 1] = g / 255;
      out[at + 3 * p + 2] = b / 255;
    }
  }
}

/**
 * The offered data as one in-memory dataset. Images are resized to `inputShape` ([h, w, 1 or 3],
 * the model's input); a CSV is parsed as the server checked it. `onProgress(done, total)` while
 * images arrive.
 */
/** The host's text (`--data FILE.txt`), for the language model: the file as the server read it at startup. */
export async function loadOfferedText(req: OfferRequest): Promise<{ name: string; text: string }> {
  const what = "loading the host's text";
  const manifest = (await (await get(req, '/data', what)).json()) as { kind: string; name: string };
  if (manifest.kind !== 'text')
    throw new DatasetError(
      `the host offers ${manifest.kind === 'csv' ? 'a CSV' : 'images'} (${manifest.name}), not a text: the language model trains on a text (npm start -- --data FILE.txt)`,
    );
  return { name: manifest.name, text: await (await get(req, '/data/0', what)).text() };
}

/** A host's image folder larger than this, decoded, is streamed (auto): loaded as the steps need it. */
export const STREAM_ABOVE_BYTES = 256 * 2 ** 20;

/**
 * Whether the host's images are streamed: 'on' always, 'off' never (all decoded at the start),
 * 'auto' when the decoded set would pass STREAM_ABOVE_BYTES.
 */
export type StreamMode = 'auto' | 'on' | 'off';

export async function loadOfferedDataset(
  req: OfferRequest,
  inputShape: number[],
  options: { stream?: StreamMode; cacheSamples?: number; onProgress?: (done: number, total: number) => void } = {},
): Promise<Dataset> {
  const { onProgress } = options;
  const what = "loading the host's data";
  const manifest = (await (await get(req, '/data', what)).json()) as
    | { kind: 'images'; name: string; classes: string[]; items: Array<{ file: string; label: number }> }
    | { kind: 'csv'; name: string; labelColumn: string }
    | { kind: 'text'; name: string };
  if (manifest.kind === 'text')
    throw new DatasetError(`the host offers a text (${manifest.name}), which trains the language model: choose model lm`);
  if (manifest.kind === 'csv') {
    const text = await (await get(req, '/data/0', what)).text();
    const column = /^-?\d+$/.test(manifest.labelColumn) ? Number(manifest.labelColumn) : manifest.labelColumn;
    return csvDataset(text, { labelColumn: column, name: manifest.name });
  }
  if (inputShape.length !== 3 || ![1, 3].includes(inputShape[2]!))
    throw new DatasetError(`images are resized to the model's input [height, width, 1 or 3]; this model takes [${inputShape.join(', ')}]`);
  const shape = inputShape as [number, number, number];
  const size = product(shape);
  const labels = Int32Array.from(manifest.items, (i) => i.label);
  const stream = options.stream ?? 'auto';
  if (stream === 'on' || (stream === 'auto' && manifest.items.length * size * 4 > STREAM_ABOVE_BYTES)) {
    return new StreamedDataset({
      name: manifest.name,
      labels,
      inputShape: [...shape],
      numClasses: manifest.classes.length,
      classNames: manifest.classes,
      ...(options.cacheSamples === undefined ? {} : { cacheSamples: options.cacheSamples }),
      load: async (i) => {
        const input = new Float32Array(size);
        const blob = await (await get(req, `/data/${i}`, `${what} (${manifest.items[i]!.file})`)).blob();
        await decodeImage(blob, manifest.items[i]!.file, shape, input, 0);
        return input;
      },
    });
  }
  const inputs = new Float32Array(manifest.items.length * size);
  let next = 0;
  let done = 0;
  // A few requests at a time: the server reads each file as it is asked for.
  const worker = async () => {
    while (next < manifest.items.length) {
      const i = next++;
      const blob = await (await get(req, `/data/${i}`, `${what} (${manifest.items[i]!.file})`)).blob();
      await decodeImage(blob, manifest.items[i]!.file, shape, inputs, i * size);
      onProgress?.(++done, manifest.items.length);
    }
  };
  await Promise.all(Array.from({ length: 6 }, worker));
  return new InMemoryDataset({
    name: manifest.name,
    inputs,
    labels,
    inputShape: [...shape],
    numClasses: manifest.classes.length,
    classNames: manifest.classes,
  });
}
