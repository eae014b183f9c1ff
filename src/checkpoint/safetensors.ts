/**
 * The safetensors format (Hugging Face's; what `safetensors.torch.save_file`/`load_file` read and
 * write): an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape
 * and byte range, then the tensors' bytes, little-endian, one after another. The format is this
 * small; the Python side reads it with the safetensors package or the reader in the exported
 * model's .py file. Runs in browsers and Node.
 */

/** The dtypes this project writes and reads (torch's float32, float16, int64, int32). */
export type SafetensorsDtype = 'F32' | 'F16' | 'I64' | 'I32';

export interface NamedTensor {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** Little-endian bytes, as many as the shape and dtype say. */
  data: Uint8Array;
}

const DTYPE_BYTES: Record<SafetensorsDtype, number> = { F32: 4, F16: 2, I64: 8, I32: 4 };

/** A safetensors file larger than this is refused when read (a header claiming more is damaged). */
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

function elements(shape: number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** One safetensors file of `tensors`, in their order; `metadata` goes into the header's `__metadata__` (strings only, as the format wants). */
export function encodeSafetensors(tensors: NamedTensor[], metadata: Record<string, string> = {}): Uint8Array<ArrayBuffer> {
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    if (t.name === '__metadata__' || t.name in header) throw new SafetensorsError(`tensor name "${t.name}" is used twice or reserved`);
    if (!t.shape.every((d) => Number.isSafeInteger(d) && d >= 0))
      throw new SafetensorsError(`tensor "${t.name}" has a bad shape [${t.shape.join(', ')}]`);
    const bytes = elements(t.shape) * DTYPE_BYTES[t.dtype];
    if (t.data.byteLength !== bytes)
      throw new SafetensorsError(`tensor "${t.name}" has ${t.data.byteLength} bytes; ${t.dtype} [${t.shape.join(', ')}] takes ${bytes}`);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  // The reference writer pads the header with spaces to a multiple of 8, so the data is aligned.
  const padded = Math.ceil(json.byteLength / 8) * 8;
  if (padded !== json.byteLength) {
    const p = new Uint8Array(padded).fill(0x20);
    p.set(json);
    json = p;
  }
  const out = new Uint8Array(8 + json.byteLength + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.byteLength), true);
  out.set(json, 8);
  let at = 8 + json.byteLength;
  for (const t of tensors) {
    out.set(t.data, at);
    at += t.data.byteLength;
  }
  return out;
}

export interface DecodedSafetensors {
  tensors: Map<string, NamedTensor>;
  metadata: Record<string, string>;
}

/** Reads a safetensors file, checking what the reference reader checks: the header, each range inside the data, no gaps or overlaps. */
export function decodeSafetensors(bytes: Uint8Array): DecodedSafetensors {
  if (bytes.byteLength < 8)
    throw new SafetensorsError(`a safetensors file starts with an 8-byte header length; this one has ${bytes.byteLength} bytes`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerBytes = Number(view.getBigUint64(0, true));
  if (headerBytes > MAX_HEADER_BYTES || 8 + headerBytes > bytes.byteLength)
    throw new SafetensorsError(
      `the header claims ${headerBytes} bytes, the file has ${bytes.byteLength - 8} after its length: truncated or not safetensors`,
    );
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(8, 8 + headerBytes)));
  } catch (err) {
    throw new SafetensorsError(`the header is not JSON: ${(err as Error).message}`);
  }
  if (typeof header !== 'object' || header === null || Array.isArray(header)) throw new SafetensorsError('the header is not a JSON object');
  const data = bytes.subarray(8 + headerBytes);
  const metadata: Record<string, string> = {};
  const entries: Array<NamedTensor & { begin: number }> = [];
  for (const [name, value] of Object.entries(header as Record<string, unknown>)) {
    if (name === '__metadata__') {
      for (const [k, v] of Object.entries((value ?? {}) as Record<string, unknown>)) if (typeof v === 'string') metadata[k] = v;
      continue;
    }
    const v = value as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (typeof v.dtype !== 'string' || !(v.dtype in DTYPE_BYTES))
      throw new SafetensorsError(`tensor "${name}" has dtype ${String(v.dtype)}; this reader takes ${Object.keys(DTYPE_BYTES).join(', ')}`);
    const dtype = v.dtype as SafetensorsDtype;
    if (!Array.isArray(v.shape) || !v.shape.every((d) => Number.isSafeInteger(d) && (d as number) >= 0))
      throw new SafetensorsError(`tensor "${name}" has a bad shape`);
    const shape = v.shape as number[];
    const offsets = v.data_offsets;
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o)))
      throw new SafetensorsError(`tensor "${name}" has bad data_offsets`);
    const [begin, end] = offsets as [number, number];
    if (begin < 0 || end < begin || end > data.byteLength)
      throw new SafetensorsError(`tensor "${name}" lies at bytes ${begin}-${end}, outside the ${data.byteLength} bytes of data`);
    if (end - begin !== elements(shape) * DTYPE_BYTES[dtype])
      throw new SafetensorsError(`tensor "${name}": ${end - begin} bytes for ${dtype} [${shape.join(', ')}]`);
    // A copy: the caller may keep it after `bytes` is gone, and typed arrays over it need alignment.
    entries.push({ name, dtype, shape, data: data.slice(begin, end), begin });
  }
  entries.sort((a, b) => a.begin - b.begin);
  let expected = 0;
  for (const e of entries) {
    if (e.begin !== expected)
      throw new SafetensorsError(`tensor "${e.name}" starts at byte ${e.begin}, expected ${expected}: the tensors overlap or leave a gap`);
    expected += e.data.byteLength;
  }
  if (expected !== data.byteLength) throw new SafetensorsError(`the tensors cover ${expected} of the ${data.byteLength} data bytes`);
  return { tensors: new Map(entries.map(({ begin: _begin, ...t }) => [t.name, t])), metadata };
}
