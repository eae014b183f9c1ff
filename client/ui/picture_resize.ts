/**
 * A picture from the camera or a file, made the session's input in the tab: cut square at its
 * centre, shrunk on a canvas to `size` x `size`, and read as floats in 0..1 (RGB, or grey by
 * luminance as the host's images are: src/datasets/offered.ts). Nothing here sends anything; the
 * pure parts (the crop, the pixel conversions) are tested in Node.
 */

/** A file that is not a picture this browser can read, or a source with no pixels: the message says which and what to do. */
export class PictureError extends Error {
  override name = 'PictureError';
}

/** The largest centred square of a `width` x `height` picture: where to cut it. */
export function squareCrop(width: number, height: number): { sx: number; sy: number; side: number } {
  if (!(width > 0 && height > 0)) throw new PictureError(`a picture of ${width} x ${height} pixels has nothing to cut`);
  const side = Math.min(width, height);
  return { sx: Math.floor((width - side) / 2), sy: Math.floor((height - side) / 2), side };
}

/** RGBA bytes of a `size` x `size` picture as the model's input: [size, size, channels] floats in 0..1. */
export function rgbaToInput(rgba: Uint8ClampedArray, size: number, channels: 1 | 3): Float32Array {
  const pixels = size * size;
  if (rgba.length !== pixels * 4)
    throw new PictureError(`${rgba.length} RGBA bytes for a ${size} x ${size} picture, expected ${pixels * 4}`);
  const out = new Float32Array(pixels * channels);
  for (let p = 0; p < pixels; p++) {
    const r = rgba[4 * p]!;
    const g = rgba[4 * p + 1]!;
    const b = rgba[4 * p + 2]!;
    if (channels === 1) out[p] = (0.299 * r + 0.587 * g + 0.114 * b) / 255;
    else {
      out[3 * p] = r / 255;
      out[3 * p + 1] = g / 255;
      out[3 * p + 2] = b / 255;
    }
  }
  return out;
}

/** The model's input back as opaque RGBA bytes (a thumbnail shows exactly what trains). */
export function inputToRgba(input: Float32Array, size: number, channels: 1 | 3): Uint8ClampedArray<ArrayBuffer> {
  const pixels = size * size;
  if (input.length !== pixels * channels)
    throw new PictureError(`${input.length} floats for a ${size} x ${size} x ${channels} picture, expected ${pixels * channels}`);
  const out = new Uint8ClampedArray(pixels * 4);
  for (let p = 0; p < pixels; p++) {
    for (let c = 0; c < 3; c++) out[4 * p + c] = Math.round(255 * input[channels === 1 ? p : 3 * p + c]!);
    out[4 * p + 3] = 255;
  }
  return out;
}

/** The image formats the file input offers (anything the browser decodes is taken). */
export const PICTURE_ACCEPT = 'image/*';

/** A drawable source (a camera's video, a decoded file) of `width` x `height`, as the model's input. */
export function resizeToInput(source: CanvasImageSource, width: number, height: number, size: number, channels: 1 | 3): Float32Array {
  const { sx, sy, side } = squareCrop(width, height);
  const canvas = document.createElement('canvas');
  canvas.width = size;
  canvas.height = size;
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  if (!ctx) throw new PictureError('this browser gives no 2D canvas to resize pictures with');
  ctx.imageSmoothingEnabled = true;
  ctx.imageSmoothingQuality = 'high';
  ctx.drawImage(source, sx, sy, side, side, 0, 0, size, size);
  return rgbaToInput(ctx.getImageData(0, 0, size, size).data, size, channels);
}

/**
 * A file chosen or dropped, as the model's input; throws PictureError, saying what the file is
 * and what to choose instead, for anything that is not a picture this browser decodes.
 */
export async function fileToInput(file: File, size: number, channels: 1 | 3): Promise<Float32Array> {
  const kind = file.type === '' ? 'a file of unknown type' : `a ${file.type} file`;
  const instead = 'choose a photo (JPEG, PNG, WebP or GIF); nothing was added';
  if (file.type !== '' && !file.type.startsWith('image/')) throw new PictureError(`“${file.name}” is not a picture (${kind}): ${instead}.`);
  let bitmap: ImageBitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch {
    throw new PictureError(`“${file.name}” (${kind}) cannot be read as a picture by this browser: ${instead}.`);
  }
  try {
    return resizeToInput(bitmap, bitmap.width, bitmap.height, size, channels);
  } finally {
    bitmap.close();
  }
}

/** Draws a picture (the model's input) on a canvas of its own size: the thumbnail. */
export function drawInput(canvas: HTMLCanvasElement, input: Float32Array, size: number, channels: 1 | 3): void {
  canvas.width = size;
  canvas.height = size;
  canvas.getContext('2d')?.putImageData(new ImageData(inputToRgba(input, size, channels), size, size), 0, 0);
}
