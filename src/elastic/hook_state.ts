/**
 * A comm hook's state (CommHookState) as a small JSON header plus one flat Float32Array, and
 * back: how the elastic runner saves a hook's state in a checkpoint (the header in the meta, the
 * values after the optimizer's in the optimizer section) and sends it to the ranks of a new round
 * along with the replica's state (elastic/recovery.ts). Reading back checks everything, since the
 * bytes come from a peer or a file.
 */
import type { CommHookState } from '../parallel/comm_hooks/types.ts';

/** A hook state without its values: its name, its meta, and its tensors' names and lengths, in the order their values follow each other. */
export interface CommHookStateHeader {
  name: string;
  meta: CommHookState['meta'];
  tensors: Array<{ name: string; length: number }>;
}

/** A header that does not describe a hook state; `reason` says why (without saying where it came from). */
export class CommHookStateFormatError extends Error {
  override name = 'CommHookStateFormatError';
  constructor(readonly reason: string) {
    super(`unreadable communication hook state: ${reason}`);
  }
}

/** The most tensors a header may list. */
export const MAX_COMM_HOOK_TENSORS = 1 << 16;
const MAX_NAME = 1_000;

/** The header and every tensor's values one after another (copies). */
export function flattenCommHookState(state: CommHookState): { header: CommHookStateHeader; data: Float32Array } {
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
export function commHookStateElements(header: CommHookStateHeader): number {
  return header.tensors.reduce((a, t) => a + t.length, 0);
}

/**
 * Checks what claims to be a header (parsed JSON from a peer or a file): a name, a meta of
 * numbers, strings, booleans and nulls, at most MAX_COMM_HOOK_TENSORS tensors with distinct names
 * and lengths holding at most `maxElements` values in all. Returns a clean copy; throws
 * CommHookStateFormatError.
 */
export function readCommHookStateHeader(raw: unknown, maxElements: number = Number.MAX_SAFE_INTEGER): CommHookStateHeader {
  const bad = (why: string) => new CommHookStateFormatError(why);
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw bad('it is not an object');
  const h = raw as Partial<Record<keyof CommHookStateHeader, unknown>>;
  if (typeof h.name !== 'string' || h.name.length === 0 || h.name.length > MAX_NAME) throw bad('its name is not a string of 1 to 1000 characters');
  if (typeof h.meta !== 'object' || h.meta === null || Array.isArray(h.meta)) throw bad('its meta is not an object');
  const meta: CommHookState['meta'] = Object.fromEntries(
    Object.entries(h.meta).map(([key, value]) => {
      if (!(value === null || typeof value === 'string' || typeof value === 'boolean' || (typeof value === 'number' && Number.isFinite(value)))) {
        throw bad(`its meta's ${JSON.stringify(key.slice(0, 40))} is not a number, a string, a boolean or null`);
      }
      return [key, value as string | number | boolean | null];
    }),
  );
  if (!Array.isArray(h.tensors) || h.tensors.length > MAX_COMM_HOOK_TENSORS) throw bad(`its tensors are not a list of at most ${MAX_COMM_HOOK_TENSORS}`);
  const names = new Set<string>();
  let total = 0;
  const tensors = h.tensors.map((t: unknown, i) => {
    const { name, length } = (typeof t === 'object' && t !== null ? t : {}) as { name?: unknown; length?: unknown };
    if (typeof name !== 'string' || name.length > MAX_NAME || names.has(name)) throw bad(`tensor ${i}'s name is missing, too long or repeated`);
    names.add(name);
    if (typeof length !== 'number' || !Number.isSafeInteger(length) || length < 0) throw bad(`tensor ${i} (${JSON.stringify(name.slice(0, 40))}) has no length`);
    total += length;
    if (total > maxElements) throw bad(`its tensors hold more than the ${maxElements} values allowed`);
    return { name, length };
  });
  return { name: h.name, meta, tensors };
}

/** The state a checked header and its values make (views into `data`, which must hold exactly the header's values). */
export function unflattenCommHookState(header: CommHookStateHeader, data: Float32Array): CommHookState {
  const total = commHookStateElements(header);
  if (data.length !== total) throw new CommHookStateFormatError(`its tensors hold ${total} values, but ${data.length} came with it`);
  const tensors: CommHookState['tensors'] = {};
  let at = 0;
  for (const { name, length } of header.tensors) {
    Object.defineProperty(tensors, name, { value: data.subarray(at, at + length), enumerable: true, writable: true, configurable: true });
    at += length;
  }
  return { name: header.name, meta: { ...header.meta }, tensors };
}
