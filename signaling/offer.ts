/**
 * The host's own model and data, offered to the sessions of this server
 * (`npm start -- --model DIR --data DIR|FILE.csv|FILE.txt [--label COLUMN]`; a .txt file is a text
 * for the built-in language model, model lm). Everything is checked when the
 * server starts, so that bad data is refused naming the file (and the line) before any tab
 * trains: a model.json whose weight files are missing or short, an image that is not a PNG or a
 * JPEG, a ragged CSV row, a label outside the classes, a model whose input or output does not fit
 * the data.
 *
 * Routes (GET only; every one needs `?session=S` and `Authorization: Bearer <S's token>`, as the
 * checkpoint routes do: the files are the host's, for the tabs of a session only):
 *
 *   /api/offer                 what is offered: {model: {name, inputShape, outputUnits, parameters, hash} | null,
 *                              data: {kind, name, classes, length, inputShape | null} | null}
 *   /api/offer/model           {modelTopology, weightSpecs}
 *   /api/offer/model/weights   the weights' bytes (the files of the manifest, in order)
 *   /api/offer/data            images: {kind: 'images', name, classes, items: [{file, label}]};
 *                              csv: {kind: 'csv', name, labelColumn}; text: {kind: 'text', name, characters}
 *   /api/offer/data/<i>        the i-th image's bytes, or (csv, text) 0: the file's text
 *
 * Images are decoded and resized in the tab (src/datasets/offered.ts); the server only reads
 * bytes, and an image's bytes only when a tab asks for that image.
 *
 * Only regular files inside the folders the host named are offered: a symbolic link (model.json,
 * a weight file, an image, a class folder) is refused at startup naming it, since its target could be any
 * file on this machine and would go to every token holder; an item is opened without following a
 * link at request time too. The bytes routes (/model/weights, /data/<i>) stream with backpressure
 * and are bounded per address, per session and server-wide, and a reader that stalls is cut
 * (`FileSendLimits`, limits.ts). The routes are in offer_routes.ts.
 */
import { createHash } from 'node:crypto';
import { constants } from 'node:fs';
import { lstat, open, readdir, realpath, stat, type FileHandle } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { basename, dirname, extname, join, resolve, sep } from 'node:path';
import { csvDataset } from '../src/datasets/csv.ts';
import { topologyLayers, type WeightSpec } from '../src/checkpoint/checkpoint_format.ts';
import { imageSizeProblem } from './image_size.ts';

export interface OfferOptions {
  /** A TF.js Layers model: a folder with model.json and its weight files (model.save(), tensorflowjs_converter). */
  modelDir?: string;
  /** A folder of images, one sub-folder per class, or a CSV file. */
  dataPath?: string;
  /** The CSV's label column: a header name or a 0-based index (negative from the end). Default: the last column. */
  labelColumn?: string;
}

/** Bad offered files: which file (and line), and what is wrong. */
export class OfferError extends Error {
  override name = 'OfferError';
}

/** Most images a folder may hold (each is a row of the tab's in-memory dataset). */
export const MAX_IMAGES = 100_000;
/** Largest image file. */
export const MAX_IMAGE_BYTES = 16 * 2 ** 20;
/** Largest CSV file and largest model (weights). */
export const MAX_CSV_BYTES = 256 * 2 ** 20;
/** Largest text (each character is an int32 token in every tab) and its largest vocabulary (the model's embedding and head). */
export const MAX_TEXT_BYTES = 32 * 2 ** 20;
export const MAX_TEXT_VOCABULARY = 1024;
/** A text shorter than this gives the language model too little to learn from (and a test split of a few windows). */
export const MIN_TEXT_CHARACTERS = 2000;
export const MAX_MODEL_BYTES = 512 * 2 ** 20;

export interface OfferedModel {
  name: string;
  modelTopology: unknown;
  weightSpecs: WeightSpec[];
  weights: Buffer;
  inputShape: number[];
  outputUnits: number;
  parameters: number;
  hash: string;
}

export type OfferedData =
  | { kind: 'images'; name: string; root: string; classes: string[]; items: Array<{ file: string; label: number; kind: 'png' | 'jpeg' }> }
  | { kind: 'csv'; name: string; file: string; labelColumn: string; classes: number; length: number; features: number }
  | { kind: 'text'; name: string; file: string; characters: number; vocabulary: number };

export interface Offer {
  model: OfferedModel | null;
  data: OfferedData | null;
  /** What /api/offer answers (and the startup lines). */
  describe(): Record<string, unknown>;
  /** The routes: true when the request was one of them. */
  handle(req: IncomingMessage, res: ServerResponse): Promise<boolean>;
}

function shapeOf(topology: unknown): { inputShape: number[]; outputUnits: number } {
  const { layers } = topologyLayers(topology);
  if (layers.length === 0) throw new OfferError('the model has no layers (a TF.js Layers model.json is needed, not a graph model)');
  const first = layers[0]!.config;
  const batch = (first.batch_input_shape ?? first.batchInputShape) as Array<number | null> | undefined;
  if (!Array.isArray(batch) || !batch.slice(1).every((d) => Number.isSafeInteger(d) && (d as number) > 0)) {
    throw new OfferError(`the model's first layer "${String(first.name)}" has no fixed input shape; save the model with inputShape set`);
  }
  const last = layers[layers.length - 1]!;
  const units = Number(last.config.units);
  if (!Number.isSafeInteger(units) || units < 2)
    throw new OfferError(
      `the model's last layer "${String(last.config.name)}" (${last.class_name}) is not a Dense layer of at least 2 units: the job trains classifiers (logits or softmax over the classes)`,
    );
  return { inputShape: batch.slice(1) as number[], outputUnits: units };
}

/** Why offered files must be regular files inside their folder, and what to do instead of a link. */
const NO_LINKS =
  "the server offers only regular files inside the folder you name (a link's target could be any file on this machine, and would go to every holder of a session's token)";

/**
 * Checks that `name` (relative to the real folder `realDir`) is a regular file there, not a
 * symbolic link or anything else, and that its real path lies inside the folder. Returns its size.
 * `flag`/`shown` say where it came from in the errors ("--model DIR", "weight file x.bin").
 */
async function regularFileInside(realDir: string, name: string, flag: string, shown: string): Promise<number> {
  const path = join(realDir, name);
  const info = await lstat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return null;
    throw new OfferError(`${flag}: ${shown} cannot be read (${err.code ?? err.message}); check its permissions`);
  });
  if (info === null) return -1;
  if (info.isSymbolicLink()) {
    const target = await realpath(path).catch(() => 'a file that does not exist');
    throw new OfferError(
      `${flag}: ${shown} is a symbolic link (to ${target}); ${NO_LINKS}: copy the file into the folder in place of the link`,
    );
  }
  if (!info.isFile()) throw new OfferError(`${flag}: ${shown} is not a regular file; ${NO_LINKS}`);
  const real = await realpath(path);
  if (!real.startsWith(realDir + sep)) throw new OfferError(`${flag}: ${shown} lies outside the folder (at ${real}); ${NO_LINKS}`);
  return info.size;
}

/** Opening for reading never follows a link in the last component (O_NOFOLLOW; Windows has none). */
const READ_NO_FOLLOW = constants.O_RDONLY | (constants.O_NOFOLLOW ?? 0);

/**
 * Opens a file checked at startup, again without following a link and only if it is still a
 * regular file (it may have been replaced since): its handle and size, or null.
 */
export async function openRegular(path: string): Promise<{ fh: FileHandle; size: number } | null> {
  const fh = await open(path, READ_NO_FOLLOW).catch(() => null);
  if (fh === null) return null;
  const info = await fh.stat().catch(() => null);
  if (info === null || !info.isFile()) {
    await fh.close();
    return null;
  }
  return { fh, size: info.size };
}

/** A whole file checked at startup (model.json, weights, a CSV, a text), read without following a link. */
async function readRegular(path: string): Promise<Buffer> {
  const opened = await openRegular(path);
  if (opened === null) throw Object.assign(new Error(`${path} is not a regular file (or cannot be opened)`), { code: 'ENOTREG' });
  try {
    return await opened.fh.readFile();
  } finally {
    await opened.fh.close();
  }
}

/** The real path of a folder the host named (which may itself be a link: the host named it). */
async function realFolder(dir: string, flag: string): Promise<string> {
  try {
    return await realpath(dir);
  } catch (err) {
    throw new OfferError(
      `${flag}: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such folder' : `cannot be read (${(err as Error).message})`}`,
    );
  }
}

async function loadModel(dir: string): Promise<OfferedModel> {
  const file = join(dir, 'model.json');
  const flag = `--model ${dir}`;
  const missing = `--model ${dir}: ${file}: not found (the folder must hold model.json and its weight files)`;
  const realDir = await realpath(dir).catch(() => null);
  if (realDir === null || (await regularFileInside(realDir, 'model.json', flag, file)) < 0) throw new OfferError(missing);
  let json: { modelTopology?: unknown; weightsManifest?: Array<{ paths: string[]; weights: WeightSpec[] }> };
  try {
    json = JSON.parse((await readRegular(join(realDir, 'model.json'))).toString('utf8')) as typeof json;
  } catch (err) {
    throw new OfferError(
      `--model ${dir}: ${file}: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'not found (the folder must hold model.json and its weight files)' : `not JSON: ${(err as Error).message}`}`,
    );
  }
  if (!json.modelTopology || !Array.isArray(json.weightsManifest))
    throw new OfferError(`--model ${dir}: ${file} is not a TF.js Layers model (it needs modelTopology and weightsManifest)`);
  const specs: WeightSpec[] = [];
  const chunks: Buffer[] = [];
  for (const group of json.weightsManifest) {
    specs.push(...group.weights);
    for (const p of group.paths) {
      const path = resolve(realDir, p);
      if (dirname(path) !== realDir) throw new OfferError(`--model ${dir}: model.json names weight file "${p}" outside its folder`);
      // Checked before it is read: a link is refused, never followed.
      if ((await regularFileInside(realDir, basename(path), flag, `weight file ${p} (named in model.json)`)) < 0)
        throw new OfferError(
          `--model ${dir}: weight file ${p} (named in model.json) cannot be read: it is not in the folder (copy it beside model.json)`,
        );
      try {
        chunks.push(await readRegular(path));
      } catch {
        throw new OfferError(`--model ${dir}: weight file ${p} (named in model.json) cannot be read`);
      }
    }
  }
  const weights = Buffer.concat(chunks);
  if (weights.byteLength > MAX_MODEL_BYTES)
    throw new OfferError(`--model ${dir}: ${weights.byteLength} bytes of weights; at most ${MAX_MODEL_BYTES} are offered to tabs`);
  let expected = 0;
  let parameters = 0;
  for (const s of specs) {
    if (s.dtype !== 'float32' || (s as WeightSpec & { quantization?: unknown }).quantization)
      throw new OfferError(
        `--model ${dir}: weight ${s.name} is ${(s as WeightSpec & { quantization?: unknown }).quantization ? 'quantized' : s.dtype}; float32 weights are trained`,
      );
    const n = s.shape.reduce((a, b) => a * b, 1);
    expected += n * 4;
    parameters += n;
  }
  if (expected !== weights.byteLength)
    throw new OfferError(
      `--model ${dir}: the weight files hold ${weights.byteLength} bytes, model.json's manifest ${expected}: a file is truncated or from another model`,
    );
  const { inputShape, outputUnits } = shapeOf(json.modelTopology);
  const hash = createHash('sha256').update(JSON.stringify(json.modelTopology)).update(weights).digest('hex').slice(0, 16);
  return {
    name: basename(resolve(dir)),
    modelTopology: json.modelTopology,
    weightSpecs: specs,
    weights,
    inputShape,
    outputUnits,
    parameters,
    hash,
  };
}

async function imageKind(path: string): Promise<'png' | 'jpeg' | null> {
  const fh = await open(path, READ_NO_FOLLOW);
  try {
    const head = Buffer.alloc(8);
    await fh.read(head, 0, 8, 0);
    if (head.equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))) return 'png';
    if (head[0] === 0xff && head[1] === 0xd8 && head[2] === 0xff) return 'jpeg';
    return null;
  } finally {
    await fh.close();
  }
}

async function loadImages(root: string): Promise<OfferedData> {
  const flag = `--data ${root}`;
  const realRoot = await realFolder(root, flag);
  const entries = await readdir(realRoot, { withFileTypes: true });
  const link = entries.find((e) => e.isSymbolicLink() && !e.name.startsWith('.'));
  if (link) {
    const target = await realpath(join(realRoot, link.name)).catch(() => 'something that does not exist');
    throw new OfferError(
      `${flag}: ${link.name} is a symbolic link (to ${target}); ${NO_LINKS}: copy the class folder into the data folder in place of the link`,
    );
  }
  const classes = entries
    .filter((e) => e.isDirectory() && !e.name.startsWith('.'))
    .map((e) => e.name)
    .sort();
  const stray = entries.filter((e) => e.isFile() && !e.name.startsWith('.'));
  if (classes.length < 2)
    throw new OfferError(
      `--data ${root}: an image folder needs one sub-folder per class (at least 2), each holding that class's PNG or JPEG images; found ${classes.length}`,
    );
  if (stray.length > 0)
    throw new OfferError(`--data ${root}: ${stray[0]!.name} lies beside the class folders; images go into their class's folder`);
  const items: Array<{ file: string; label: number; kind: 'png' | 'jpeg' }> = [];
  for (const [label, cls] of classes.entries()) {
    const files = (await readdir(join(realRoot, cls), { withFileTypes: true }))
      .filter((e) => !e.name.startsWith('.'))
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    if (files.length === 0) throw new OfferError(`--data ${root}: class folder ${cls} has no images`);
    for (const f of files) {
      const file = join(cls, f.name);
      if (!f.isFile() && !f.isSymbolicLink())
        throw new OfferError(`--data ${root}: ${file} is not a file (class folders hold images only, no sub-folders)`);
      const path = join(realRoot, file);
      // lstat: a link is refused, never followed (served, its target would go to every token holder).
      const size = await regularFileInside(realRoot, file, flag, file);
      if (size < 0) throw new OfferError(`--data ${root}: ${file} disappeared while the folder was read; start the server again`);
      if (size > MAX_IMAGE_BYTES)
        throw new OfferError(`--data ${root}: ${file} has ${size} bytes; images of at most ${MAX_IMAGE_BYTES} are offered`);
      const kind = await imageKind(path);
      if (kind === null) throw new OfferError(`--data ${root}: ${file} is not a PNG or JPEG image (its first bytes say otherwise)`);
      // Its size from its header: one too large (a decompression bomb) would be decoded whole in every tab.
      const problem = await imageSizeProblem(path, file, kind);
      if (problem !== null) throw new OfferError(`--data ${root}: ${problem}`);
      items.push({ file, label, kind });
      if (items.length > MAX_IMAGES)
        throw new OfferError(`--data ${root}: more than ${MAX_IMAGES} images; a tab holds the whole set in memory`);
    }
  }
  return { kind: 'images', name: basename(resolve(root)), root: realRoot, classes, items };
}

/**
 * A data file the host named (a CSV, a text): its real path (a link the host named is theirs to
 * follow; it is resolved once, here, and served from there without following links), checked to
 * be a regular file, and its size.
 */
async function namedFile(file: string): Promise<{ real: string; size: number }> {
  const real = await realpath(file).catch(() => null);
  const info = real === null ? null : await stat(real).catch(() => null);
  if (real === null || info === null) throw new OfferError(`--data ${file}: no such file or folder`);
  if (!info.isFile()) throw new OfferError(`--data ${file} is not a regular file (a device, a pipe, ...): name a file on disk`);
  return { real, size: info.size };
}

async function loadCsv(file: string, labelColumn: string | undefined): Promise<OfferedData> {
  const { real, size } = await namedFile(file);
  if (size > MAX_CSV_BYTES) throw new OfferError(`--data ${file}: ${size} bytes; a CSV of at most ${MAX_CSV_BYTES} is offered`);
  const text = (await readRegular(real)).toString('utf8');
  const column = labelColumn ?? '-1';
  const asIndex = /^-?\d+$/.test(column) ? Number(column) : column;
  try {
    // The tab parses it with the same code: what passes here trains there.
    const d = csvDataset(text, { labelColumn: asIndex, name: basename(file) });
    return {
      kind: 'csv',
      name: basename(file),
      file: real,
      labelColumn: column,
      classes: d.numClasses,
      length: d.length,
      features: d.inputShape[0]!,
    };
  } catch (err) {
    throw new OfferError(`--data ${file}: ${(err as Error).message}`);
  }
}

async function loadText(file: string): Promise<OfferedData> {
  const { real, size } = await namedFile(file);
  if (size > MAX_TEXT_BYTES)
    throw new OfferError(`--data ${file}: ${size} bytes; a text of at most ${MAX_TEXT_BYTES} is offered (every tab holds it as tokens)`);
  const bytes = await readRegular(real);
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    // Where: the first line holding a byte that is not UTF-8.
    const lossy = new TextDecoder('utf-8').decode(bytes);
    const line = lossy.slice(0, Math.max(0, lossy.indexOf('\uFFFD'))).split('\n').length;
    throw new OfferError(`--data ${file}: line ${line} is not UTF-8 text; save the file as UTF-8`);
  }
  // Counted by code point without an array of them (a 32 MiB text would make one of millions of strings).
  let count = 0;
  const distinct = new Set<string>();
  for (const c of text) {
    count++;
    distinct.add(c);
  }
  if (count < MIN_TEXT_CHARACTERS)
    throw new OfferError(`--data ${file}: ${count} characters; the language model needs a text of at least ${MIN_TEXT_CHARACTERS}`);
  const vocabulary = distinct.size;
  if (vocabulary > MAX_TEXT_VOCABULARY)
    throw new OfferError(
      `--data ${file}: ${vocabulary} distinct characters; the character-level model takes at most ${MAX_TEXT_VOCABULARY} (a text in one or two scripts)`,
    );
  return { kind: 'text', name: basename(file), file: real, characters: count, vocabulary };
}

/** What the host offers, read and checked (no routes yet). */
export interface OfferFiles {
  model: OfferedModel | null;
  data: OfferedData | null;
}

/**
 * Reads and checks what the host offers; throws OfferError naming the file and what is wrong.
 * `npm start` calls it before building the page, so that bad data does not wait for the build.
 */
export async function readOffer(options: OfferOptions): Promise<OfferFiles> {
  const model = options.modelDir === undefined ? null : await loadModel(options.modelDir);
  let data: OfferedData | null = null;
  if (options.dataPath !== undefined) {
    const s = await stat(options.dataPath).catch(() => null);
    if (s === null) throw new OfferError(`--data ${options.dataPath}: no such file or folder`);
    if (s.isDirectory()) data = await loadImages(options.dataPath);
    else if (extname(options.dataPath).toLowerCase() === '.csv') data = await loadCsv(options.dataPath, options.labelColumn);
    else if (extname(options.dataPath).toLowerCase() === '.txt') data = await loadText(options.dataPath);
    else
      throw new OfferError(
        `--data ${options.dataPath}: a folder of images (one sub-folder per class), a .csv file or a .txt text (for the language model) is offered`,
      );
  }
  if (model && data?.kind === 'text')
    throw new OfferError(`--data ${options.dataPath} is a text, which trains the built-in language model (model lm); leave out --model`);
  if (options.labelColumn !== undefined && data?.kind !== 'csv')
    throw new OfferError("--label names the CSV's label column: it goes with --data FILE.csv");
  if (model && data && data.kind !== 'text') {
    const classes = data.kind === 'images' ? data.classes.length : data.classes;
    if (model.outputUnits !== classes)
      throw new OfferError(
        `--model ${options.modelDir} has ${model.outputUnits} outputs, --data ${options.dataPath} ${classes} classes: the model's last layer must have one unit per class`,
      );
    if (data.kind === 'csv' && (model.inputShape.length !== 1 || model.inputShape[0] !== data.features)) {
      throw new OfferError(
        `--model ${options.modelDir} takes inputs [${model.inputShape.join(', ')}], --data ${options.dataPath} has ${data.features} feature columns: the model must take [${data.features}]`,
      );
    }
    if (data.kind === 'images' && (model.inputShape.length !== 3 || ![1, 3].includes(model.inputShape[2]!))) {
      throw new OfferError(
        `--model ${options.modelDir} takes inputs [${model.inputShape.join(', ')}]; images are resized to [height, width, channels] with 1 (grey) or 3 (RGB) channels`,
      );
    }
  }
  return { model, data };
}
