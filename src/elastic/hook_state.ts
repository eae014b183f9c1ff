/**
 * A hook's state (a strategy's own state that lasts across rounds: DDP's communication hook's,
 * PowerSGD's Q matrices and error feedback, DiLoCo's outer state) as a small JSON header plus one
 * flat Float32Array, and back: how a run saves it in a checkpoint (the header in the meta, the
 * values after the optimizer's in the optimizer section: `appendCommHookState`) and sends it to
 * the ranks of a new round along with the replica's state (recovery.ts). The agent carries it
 * without reading it: it is named tensors and a few scalars. Reading back checks everything,
 * since the bytes come from a peer or a file. The formats keep the name they were first saved
 * under (`meta.commHook`, specs `commHook/<tensor>`), so checkpoints saved before still load.
 */
import { CheckpointCorruptError } from '../checkpoint/checkpoint_format.ts';
import type { TensorBundle, WeightSpec } from '../wire/tfjs_artifacts.ts';

/** State a hook keeps across steps, for checkpoints and joiners: plain numbers in `meta`, arrays in `tensors` (parallel/comm_hooks' HookState). */
export interface HookState {
  name: string;
  meta: Record<string, number | string | boolean | null>;
  tensors: Record<string, Float32Array>;
}

/** A hook state without its values: its name, its meta, and its tensors' names and lengths, in the order their values follow each other. */
export interface HookStateHeader {
  name: string;
  meta: HookState['meta'];
  tensors: Array<{ name: string; length: number }>;
}

/** A header that does not describe a hook state; `reason` says why (without saying where it came from). */
export class HookStateFormatError extends Error {
  override name = 'HookStateFormatError';
  constructor(readonly reason: string) {
    super(`unreadable communication hook state: ${reason}`);
  }
}

/** The most tensors a header may list. */
export const MAX_HOOK_STATE_TENSORS = 1 << 16;
const MAX_NAME = 1_000;

/** The header and every tensor's values one after another (copies). */
export function flattenHookState(state: HookState): { header: HookStateHeader; data: Float32Array } {
  const entries = Object.entries(state.tensors);
  const tensors = entries.map(([name, values]) => ({ name, length: values.length }));
  const data = new Float32Array(tensors.reduce((a, t) => a + t.length, 0));
  let at = 0;
  for (const [, values] of entries) {
    data.set(values, at);
    at += values.length;
  }
  return { header: { name: state.name, meta: { ...state.meta }, tensors }, data };
}

/** The number of values a (checked) header's tensors hold. */
export function hookStateElements(header: HookStateHeader): number {
  return header.tensors.reduce((a, t) => a + t.length, 0);
}

/**
 * Checks what claims to be a header (parsed JSON from a peer or a file): a name, a meta of
 * numbers, strings, booleans and nulls, at most MAX_HOOK_STATE_TENSORS tensors with distinct names
 * and lengths holding at most `maxElements` values in all. Returns a clean copy; throws
 * HookStateFormatError.
 */
export function readHookStateHeader(raw: unknown, maxElements: number = Number.MAX_SAFE_INTEGER): HookStateHeader {
  const bad = (why: string) => new HookStateFormatError(why);
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw bad('it is not an object');
  const h = raw as Partial<Record<keyof HookStateHeader, unknown>>;
  if (typeof h.name !== 'string' || h.name.length === 0 || h.name.length > MAX_NAME)
    throw bad('its name is not a string of 1 to 1000 characters');
  if (typeof h.meta !== 'object' || h.meta === null || Array.isArray(h.meta)) throw bad('its meta is not an object');
  const meta: HookState['meta'] = Object.fromEntries(
    Object.entries(h.meta).map(([key, value]) => {
      if (
        !(
          value === null ||
          typeof value === 'string' ||
          typeof value === 'boolean' ||
          (typeof value === 'number' && Number.isFinite(value))
        )
      ) {
        throw bad(`its meta's ${JSON.stringify(key.slice(0, 40))} is not a number, a string, a boolean or null`);
      }
      return [key, value as string | number | boolean | null];
    }),
  );
  if (!Array.isArray(h.tensors) || h.tensors.length > MAX_HOOK_STATE_TENSORS)
    throw bad(`its tensors are not a list of at most ${MAX_HOOK_STATE_TENSORS}`);
  const names = new Set<string>();
  let total = 0;
  const tensors = h.tensors.map((t: unknown, i) => {
    const { name, length } = (typeof t === 'object' && t !== null ? t : {}) as { name?: unknown; length?: unknown };
    if (typeof name !== 'string' || name.length > MAX_NAME || names.has(name))
      throw bad(`tensor ${i}'s name is missing, too long or repeated`);
    names.add(name);
    if (typeof length !== 'number' || !Number.isSafeInteger(length) || length < 0)
      throw bad(`tensor ${i} (${JSON.stringify(name.slice(0, 40))}) has no length`);
    total += length;
    if (total > maxElements) throw bad(`its tensors hold more than the ${maxElements} values allowed`);
    return { name, length };
  });
  return { name: h.name, meta, tensors };
}

/** The state a checked header and its values make (views into `data`, which must hold exactly the header's values). */
export function unflattenHookState(header: HookStateHeader, data: Float32Array): HookState {
  const total = hookStateElements(header);
  if (data.length !== total) throw new HookStateFormatError(`its tensors hold ${total} values, but ${data.length} came with it`);
  const tensors: HookState['tensors'] = {};
  let at = 0;
  for (const { name, length } of header.tensors) {
    Object.defineProperty(tensors, name, { value: data.subarray(at, at + length), enumerable: true, writable: true, configurable: true });
    at += length;
  }
  return { name: header.name, meta: { ...header.meta }, tensors };
}

/** The spec name of a hook state's tensor in a checkpoint's optimizer section. */
const hookSpecName = (tensor: string) => `commHook/${tensor}`;

/**
 * A checkpoint's optimizer section with `commHook`'s values after the optimizer's own, and the
 * header that goes in its meta (`meta.commHook`); the section unchanged and no header without one.
 */
export function appendCommHookState(
  optimizer: TensorBundle,
  commHook: HookState | null | undefined,
): { optimizer: TensorBundle; header: HookStateHeader | null } {
  if (!commHook) return { optimizer, header: null };
  const { header, data } = flattenHookState(commHook);
  const bytes = new Uint8Array(optimizer.weightData.byteLength + data.byteLength);
  bytes.set(new Uint8Array(optimizer.weightData), 0);
  bytes.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), optimizer.weightData.byteLength);
  const specs = header.tensors.map((t): WeightSpec => ({ name: hookSpecName(t.name), shape: [t.length], dtype: 'float32' }));
  return { optimizer: { weightSpecs: [...optimizer.weightSpecs, ...specs], weightData: bytes.buffer }, header };
}

/**
 * The reverse of `appendCommHookState`, for a checkpoint's meta and optimizer section: the
 * optimizer's own tensors, and the hook state of `meta.commHook` (null when the checkpoint has
 * none, as every checkpoint saved before hooks were). Throws CheckpointCorruptError('header')
 * when `meta.commHook` does not match the section's last tensors.
 */
export function splitCommHookState(
  meta: Record<string, unknown>,
  optimizer: TensorBundle,
  name?: string,
): { optimizer: TensorBundle; commHook: HookState | null } {
  if (meta.commHook === undefined || meta.commHook === null) return { optimizer, commHook: null };
  const corrupt = (why: string) => new CheckpointCorruptError('header', `its communication hook state ${why}`, name);
  let header: HookStateHeader;
  try {
    header = readHookStateHeader(meta.commHook);
  } catch (err) {
    if (err instanceof HookStateFormatError) throw corrupt(`is unreadable: ${err.reason}`);
    throw err;
  }
  const n = header.tensors.length;
  const specs = optimizer.weightSpecs;
  const own = specs.slice(0, specs.length - n);
  const theirs = specs.slice(specs.length - n);
  if (
    specs.length < n ||
    !theirs.every(
      (s, i) =>
        s.name === hookSpecName(header.tensors[i]!.name) &&
        s.dtype === 'float32' &&
        s.shape.length === 1 &&
        s.shape[0] === header.tensors[i]!.length,
    )
  ) {
    throw corrupt(`lists ${n} tensors that are not the optimizer section's last ${n}`);
  }
  const hookBytes = 4 * hookStateElements(header);
  const total = optimizer.weightData.byteLength;
  if (hookBytes > total) throw corrupt(`needs ${hookBytes} bytes, the optimizer section has ${total}`);
  const values = new Float32Array(optimizer.weightData.slice(total - hookBytes));
  return {
    optimizer: { weightSpecs: own, weightData: optimizer.weightData.slice(0, total - hookBytes) },
    commHook: unflattenHookState(header, values),
  };
}
