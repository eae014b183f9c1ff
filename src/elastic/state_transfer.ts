/**
 * A state transfer between the ranks of a round (recovery.ts decides who sends to whom): the
 * source's state dict, run record and hook state as a small JSON header (its length, then
 * itself) and one body of 4-byte words (the model's bytes, the optimizer's, the hook's values),
 * in broadcasts to the whole group or point to point to the few ranks that lack it. Every rank,
 * the source too, checks the header against its own model before allocating what it announces,
 * since a peer may send anything.
 */
import type * as tf from '@tensorflow/tfjs';
import { StateTransferError } from '../wire/errors.ts';
import type { WeightSpec } from '../wire/tfjs_artifacts.ts';
import type { ProcessGroup } from '../c10d/process_group.ts';
import type { Json, Progress, TrainState, TrainStateDict } from '../checkpoint/state_dict.ts';
import {
  flattenHookState,
  hookStateElements,
  HookStateFormatError,
  readHookStateHeader,
  unflattenHookState,
  type HookState,
  type HookStateHeader,
} from './hook_state.ts';
import { isProgress, isRunRecord, type RunRecord } from './run_record.ts';

interface Header {
  progress: Progress;
  extras: Json;
  run: RunRecord;
  note?: string;
  modelSpecs: WeightSpec[];
  modelBytes: number;
  optimizerSpecs: WeightSpec[];
  optimizerBytes: number;
  /** The source's communication hook's name (absent from a source without one to name: a checkpoint without hook state). */
  commHookName?: string;
  /** Its state without the values, which follow the optimizer's in a broadcast of their own; absent or null for none. */
  commHook?: HookStateHeader | null;
}

/** What the source of a state transfer sends besides its TrainState. */
export interface SourceExtras {
  run: RunRecord;
  /** The source's state as already read (else it is read here). */
  sd?: TrainStateDict;
  note?: string;
  commHookName?: string;
  commHook?: HookState | null;
}

/**
 * The most values a hook state sent with a replica's state may hold: four per trainable
 * parameter of the receiving model, plus 65536 (PowerSGD keeps at most two: a Q and an error).
 */
export function maxCommHookElements(model: tf.LayersModel): number {
  const params = model.trainableWeights.reduce((a, w) => a + numel(w.shape as number[]), 0);
  return 4 * params + 65_536;
}

/** The largest header (progress, run record, weight specs, the user's extras, as JSON) a rank accepts. */
export const MAX_STATE_HEADER_BYTES = 16 << 20;

/** What a transfer hands back to the rank that received it. */
export interface Shared {
  run: RunRecord;
  note?: string;
  commHook: { name: string | null; state: HookState | null };
}

/**
 * Sends `source`'s state (and run record, and hook state) to every rank of `pg`: a small JSON
 * header (its length, then itself), then in one broadcast the model's and the optimizer's bytes
 * and the hook state's values when the header announces some. Every rank, the source too, checks
 * the header against its own model before allocating what it announces, then loads what was sent
 * (the hook state is returned, not loaded).
 */
export async function broadcastState(pg: ProcessGroup, source: number, state: TrainState, mine: SourceExtras | null): Promise<Shared> {
  const packed = pg.rank === source ? await packState(state, mine!) : null;
  const length = await pg.broadcast(Float32Array.of(packed ? packed.header.length : 0), source);
  // The source checks its own too, so that a header too big fails every rank alike.
  const words = packed ? packed.header : new Float32Array(headerWords(source, length[0]!));
  await pg.broadcast(words, source);
  const { header, layout, bodyWords } = readHeader(source, words, state.model);
  if (packed && packed.body.length !== bodyWords)
    throw new StateTransferError(
      source,
      'communication hook state',
      `its header announces ${bodyWords} words of state, its tensors hold ${packed.body.length}`,
    );
  // Weights, optimizer state and the hook's values in one broadcast: each broadcast is a round
  // trip through the whole group (at 32 tabs on two cores about 0.6 s).
  const body = packed ? packed.body : new Float32Array(bodyWords);
  await pg.broadcast(body, source);
  return loadState(state, header, layout, body);
}

/**
 * The state to the ranks that lack it, point to point: each rank of `holders` (which hold the
 * source's bytes, by their digests) sends its header's length, the header and the body to each
 * rank of `needers` dealt to it (to all of them at once, each one's three messages in order,
 * without waiting for an answer); the others take part in nothing. One message's latency rather
 * than three broadcasts' through the whole group.
 */
export async function sendToNeeders(
  pg: ProcessGroup,
  holders: number[],
  needers: number[],
  state: TrainState,
  mine: SourceExtras,
): Promise<Shared | null> {
  const senderOf = (k: number) => holders[k % holders.length]!;
  const me = pg.rank;
  if (holders.includes(me)) {
    const sd = mine.sd ?? (await state.stateDict());
    const mineToSend = needers.filter((_, k) => senderOf(k) === me);
    if (mineToSend.length > 0) {
      const packed = await packState(state, { ...mine, sd });
      await Promise.all(
        mineToSend.map(async (dst) => {
          await pg.send(Float32Array.of(packed.header.length), dst);
          await pg.send(packed.header, dst);
          await pg.send(packed.body, dst);
        }),
      );
    }
    // A holder loads its own bytes as the receivers load them: every rank then runs an optimizer
    // restored from the same bytes (a restored Adam's beta powers can differ in the last bit
    // from a running one's: see TrainStateOptions.optimizer).
    await state.loadStateDict(sd);
    return null;
  }
  const k = needers.indexOf(me);
  const from = senderOf(k);
  const length = await pg.recv(new Float32Array(1), from);
  const words = await pg.recv(new Float32Array(headerWords(from, length[0]!)), from);
  const { header, layout, bodyWords } = readHeader(from, words, state.model);
  const body = await pg.recv(new Float32Array(bodyWords), from);
  return loadState(state, header, layout, body);
}

/** A source's state as it travels: the header's JSON in 4-byte words, and the body (weights, optimizer state, hook values). */
async function packState(state: TrainState, mine: SourceExtras): Promise<{ header: Float32Array; body: Float32Array }> {
  const sd = mine.sd ?? (await state.stateDict());
  const hook = mine.commHook ? flattenHookState(mine.commHook) : null;
  const header: Header = {
    progress: sd.progress,
    extras: sd.extras,
    run: mine.run,
    note: mine.note,
    modelSpecs: sd.model.weightSpecs,
    modelBytes: sd.model.weightData.byteLength,
    optimizerSpecs: sd.optimizer.weightSpecs,
    optimizerBytes: sd.optimizer.weightData.byteLength,
    ...(mine.commHookName === undefined ? {} : { commHookName: mine.commHookName }),
    commHook: hook?.header ?? null,
  };
  const json = new TextEncoder().encode(JSON.stringify(header));
  const words = new Float32Array(Math.ceil(json.length / 4));
  new Uint8Array(words.buffer).set(json);
  // They travel as raw 4-byte words, copied as bytes, never computed on.
  const hookBytes = hook ? new Uint8Array(hook.data.buffer, hook.data.byteOffset, hook.data.byteLength) : new Uint8Array(0);
  const body = new Float32Array((sd.model.weightData.byteLength + sd.optimizer.weightData.byteLength + hookBytes.byteLength) / 4);
  const bytes = new Uint8Array(body.buffer);
  bytes.set(new Uint8Array(sd.model.weightData), 0);
  bytes.set(new Uint8Array(sd.optimizer.weightData), sd.model.weightData.byteLength);
  bytes.set(hookBytes, sd.model.weightData.byteLength + sd.optimizer.weightData.byteLength);
  return { header: words, body };
}

/** A declared header length, checked before anything is allocated for it. */
function headerWords(source: number, declared: number): number {
  if (!Number.isSafeInteger(declared) || declared < 0 || declared * 4 > MAX_STATE_HEADER_BYTES) {
    throw new StateTransferError(
      source,
      'header',
      `a header of ${declared} 4-byte words is not a length up to ${MAX_STATE_HEADER_BYTES} bytes`,
    );
  }
  return declared;
}

/** The header from `source`, checked against this rank's model, and the body's length it announces. */
function readHeader(
  source: number,
  words: Float32Array,
  model: tf.LayersModel,
): { header: Header; layout: ReturnType<typeof checkLayout>; bodyWords: number } {
  const header = parseHeader(source, words);
  const layout = checkLayout(source, header, model);
  const hookWords = layout.commHook ? hookStateElements(layout.commHook) : 0;
  return { header, layout, bodyWords: (layout.modelBytes + layout.optimizerBytes) / 4 + hookWords };
}

/** Loads a received body into `state`; the hook's values are returned, not loaded. */
async function loadState(state: TrainState, header: Header, layout: ReturnType<typeof checkLayout>, body: Float32Array): Promise<Shared> {
  const bytes = new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  const model = bytes.slice(0, layout.modelBytes).buffer;
  const optimizer = bytes.slice(layout.modelBytes, layout.modelBytes + layout.optimizerBytes).buffer;
  const hookState = layout.commHook
    ? unflattenHookState(layout.commHook, body.slice((layout.modelBytes + layout.optimizerBytes) / 4))
    : null;
  await state.loadStateDict({
    progress: header.progress,
    extras: header.extras,
    model: { modelTopology: null, weightSpecs: layout.modelSpecs, weightData: model },
    optimizer: { weightSpecs: layout.optimizerSpecs, weightData: optimizer },
  });
  return { run: header.run, note: header.note, commHook: { name: header.commHookName ?? hookState?.name ?? null, state: hookState } };
}

/** The header's JSON, its fields checked; the weight specs are checked by `checkLayout`. */
function parseHeader(source: number, words: Float32Array): Header {
  const bad = (why: string) => new StateTransferError(source, 'header', why);
  let raw: unknown;
  try {
    raw = JSON.parse(new TextDecoder().decode(new Uint8Array(words.buffer, words.byteOffset, words.byteLength)).replace(/\0+$/, ''));
  } catch {
    throw bad('it is not JSON');
  }
  if (typeof raw !== 'object' || raw === null) throw bad('it is not a JSON object');
  const h = raw as Partial<Header>;
  if (!isProgress(h.progress)) throw bad('its progress is not {step, epoch, position} of non-negative integers');
  if (!isRunRecord(h.run)) throw bad('its run record is not {generations, stepsRedone, resumes}');
  if (h.note !== undefined && typeof h.note !== 'string') throw bad('its note is not a string');
  if (!Array.isArray(h.modelSpecs) || !Array.isArray(h.optimizerSpecs)) throw bad('its weight specs are not lists');
  if (typeof h.modelBytes !== 'number' || typeof h.optimizerBytes !== 'number') throw bad('its byte counts are not numbers');
  if (h.commHookName !== undefined && (typeof h.commHookName !== 'string' || h.commHookName.length > 1_000))
    throw bad('its communication hook name is not a string');
  return { ...h, extras: h.extras ?? null } as Header;
}

/**
 * Checks the announced weights against this rank's own model, before anything is allocated:
 * the model's specs must be its weights' shapes and types, in order; each optimizer slot a scalar
 * (the step count) or the shape of a trainable weight (moments), at most three per weight; and
 * both byte counts what those specs make. Returns clean specs (names unique) to load.
 */
function checkLayout(
  source: number,
  h: Header,
  model: tf.LayersModel,
): {
  modelSpecs: WeightSpec[];
  modelBytes: number;
  optimizerSpecs: WeightSpec[];
  optimizerBytes: number;
  commHook: HookStateHeader | null;
} {
  const weights = model.weights;
  if (h.modelSpecs.length !== weights.length) {
    throw new StateTransferError(source, 'model', `it sends ${h.modelSpecs.length} weight tensors, this model has ${weights.length}`);
  }
  const names = new Set<string>();
  const cleanName = (spec: unknown, where: string): string => {
    const name = (spec as Partial<WeightSpec> | null)?.name;
    if (typeof name !== 'string' || name.length > 1_000 || names.has(name))
      throw new StateTransferError(source, where, 'its name is missing, too long or repeated');
    names.add(name);
    return name;
  };
  let modelBytes = 0;
  const modelSpecs = h.modelSpecs.map((spec: unknown, i): WeightSpec => {
    const w = weights[i]!;
    const where = `parameter ${i} (${w.originalName})`;
    const s = spec as Partial<WeightSpec> | null;
    if (!sameShape(s?.shape, w.shape) || s?.dtype !== w.dtype || !fourByte(w.dtype)) {
      throw new StateTransferError(
        source,
        where,
        `it sends shape ${describeShape(s?.shape)} ${String(s?.dtype).slice(0, 20)}, this model has [${w.shape.join(', ')}] ${w.dtype}`,
      );
    }
    modelBytes += numel(w.shape as number[]) * 4;
    return { name: cleanName(spec, where), shape: [...(w.shape as number[])], dtype: w.dtype };
  });
  if (h.modelBytes !== modelBytes)
    throw new StateTransferError(source, 'model', `it announces ${h.modelBytes} bytes of weights, this model's weights take ${modelBytes}`);

  const slotShapes = [[], ...model.trainableWeights.map((w) => w.shape as number[])];
  const maxSlots = 1 + 3 * model.trainableWeights.length;
  if (h.optimizerSpecs.length > maxSlots) {
    throw new StateTransferError(
      source,
      'optimizer',
      `it sends ${h.optimizerSpecs.length} optimizer tensors, more than the ${maxSlots} an optimizer of this model's ${model.trainableWeights.length} trainable weights has`,
    );
  }
  let optimizerBytes = 0;
  const optimizerSpecs = h.optimizerSpecs.map((spec: unknown, i): WeightSpec => {
    const s = spec as Partial<WeightSpec> | null;
    const where = `optimizer tensor ${i}`;
    const shape = slotShapes.find((sh) => sameShape(s?.shape, sh));
    if (!shape || typeof s?.dtype !== 'string' || !fourByte(s.dtype)) {
      throw new StateTransferError(
        source,
        where,
        `shape ${describeShape(s?.shape)} ${String(s?.dtype).slice(0, 20)} is neither a scalar nor the shape of one of this model's trainable weights`,
      );
    }
    optimizerBytes += numel(shape) * 4;
    return { name: cleanName(spec, where), shape: [...shape], dtype: s.dtype };
  });
  if (h.optimizerBytes !== optimizerBytes) {
    throw new StateTransferError(
      source,
      'optimizer',
      `it announces ${h.optimizerBytes} bytes of optimizer state, its tensors take ${optimizerBytes}`,
    );
  }
  let commHook: HookStateHeader | null = null;
  if (h.commHook != null) {
    try {
      commHook = readHookStateHeader(h.commHook, maxCommHookElements(model));
    } catch (err) {
      if (err instanceof HookStateFormatError) throw new StateTransferError(source, 'communication hook state', err.reason);
      throw err;
    }
  }
  return { modelSpecs, modelBytes, optimizerSpecs, optimizerBytes, commHook };
}

function sameShape(a: unknown, b: readonly (number | null)[]): boolean {
  return Array.isArray(a) && a.length === b.length && a.every((d, k) => d === b[k]);
}

function describeShape(shape: unknown): string {
  return Array.isArray(shape)
    ? `[${shape
        .slice(0, 8)
        .map((d) => String(d).slice(0, 12))
        .join(', ')}${shape.length > 8 ? ', ...' : ''}]`
    : 'none';
}

function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Weights travel as 4-byte words. */
function fourByte(dtype: string): boolean {
  return dtype === 'float32' || dtype === 'int32';
}
