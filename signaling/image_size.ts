/**
 * The pixel size of the host's offered images, read from their headers at startup (PNG's IHDR, a
 * JPEG's frame header): no image is decoded here. Every tab decodes every image whole before it
 * resizes it to the model's input, so one image of 100000x100000 pixels (a few KB of PNG: a
 * decompression bomb) would take 40 GB in each tab; an image larger than MAX_IMAGE_SIDE on a side
 * stops the server's start (the offer's loadImages asks `imageSizeProblem` for each image as it
 * reads the folder), naming the file, its size and the bound.
 */
import { constants } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';

/** Largest width and height of an offered image: 4096x4096 RGBA is 64 MiB decoded, per tab. */
export const MAX_IMAGE_SIDE = 4096;

export interface ImageSize {
  width: number;
  height: number;
}

/** Segments read before a JPEG's frame header is given up on (a real one has a few dozen at most). */
const MAX_JPEG_SEGMENTS = 1024;
/** Bytes read at once while walking a JPEG's segments. */
const WINDOW_BYTES = 64 * 1024;

/**
 * Why the image at `path` (`file` in messages) cannot be offered: larger than MAX_IMAGE_SIDE on a
 * side, or a header that gives no size; null when it can.
 */
export async function imageSizeProblem(path: string, file: string, kind: 'png' | 'jpeg'): Promise<string | null> {
  const size = await readImageSize(path, kind);
  if (typeof size === 'string') return `${file}: ${size}; re-save it as a PNG or JPEG (any image editor does), or leave it out`;
  if (size.width <= MAX_IMAGE_SIDE && size.height <= MAX_IMAGE_SIDE) return null;
  return `${file} is ${size.width}x${size.height} pixels; images of at most ${MAX_IMAGE_SIDE}x${MAX_IMAGE_SIDE} are offered (every tab decodes each image whole, so a larger one can take all of a tab's memory): resize it (ImageMagick: mogrify -resize '${MAX_IMAGE_SIDE}x${MAX_IMAGE_SIDE}>' FILE) or leave it out`;
}

/** An image's width and height from its header, or why its header gives none. */
export async function readImageSize(path: string, kind: 'png' | 'jpeg'): Promise<ImageSize | string> {
  // Not following a link: the offer checked that each image is a regular file, and serves it so.
  const fh = await open(path, constants.O_RDONLY | (constants.O_NOFOLLOW ?? 0));
  try {
    return kind === 'png' ? await pngSize(fh) : await jpegSize(fh);
  } finally {
    await fh.close();
  }
}

/** PNG: the signature, then the IHDR chunk first (the format requires it): width and height, big-endian u32. */
async function pngSize(fh: FileHandle): Promise<ImageSize | string> {
  const head = Buffer.alloc(24);
  const { bytesRead } = await fh.read(head, 0, 24, 0);
  if (bytesRead < 24 || head.toString('latin1', 12, 16) !== 'IHDR') return 'its PNG header (IHDR) is missing or cut short';
  const size = { width: head.readUInt32BE(16), height: head.readUInt32BE(20) };
  return size.width === 0 || size.height === 0 ? `its PNG header gives a size of ${size.width}x${size.height}` : size;
}

/** The start-of-frame markers (baseline, progressive, lossless, arithmetic): SOF0-15 but DHT (C4), JPG (C8) and DAC (CC). */
const isFrameHeader = (m: number) => m >= 0xc0 && m <= 0xcf && m !== 0xc4 && m !== 0xc8 && m !== 0xcc;
/** Markers without a length: TEM, RST0-7, SOI. */
const standalone = (m: number) => m === 0x01 || (m >= 0xd0 && m <= 0xd8);

/**
 * JPEG: walks the segments after SOI (each 0xFF, a marker, a big-endian length that counts
 * itself) up to the frame header, whose payload is precision, height, width. Image data (SOS) or
 * the end (EOI) before one means there is no size to read.
 */
async function jpegSize(fh: FileHandle): Promise<ImageSize | string> {
  const fileBytes = (await fh.stat()).size;
  let window = Buffer.alloc(0);
  let windowAt = 0;
  /** `n` bytes at `pos` (n <= 16), from the window when it holds them. */
  const bytesAt = async (pos: number, n: number): Promise<Buffer | null> => {
    if (pos + n > fileBytes) return null;
    if (pos < windowAt || pos + n > windowAt + window.length) {
      window = Buffer.alloc(Math.min(WINDOW_BYTES, fileBytes - pos));
      const { bytesRead } = await fh.read(window, 0, window.length, pos);
      window = window.subarray(0, bytesRead);
      windowAt = pos;
      if (bytesRead < n) return null;
    }
    return window.subarray(pos - windowAt, pos - windowAt + n);
  };
  let pos = 2; // after SOI (FF D8), which the offer checked
  for (let segments = 0; segments < MAX_JPEG_SEGMENTS; segments++) {
    const marker = await bytesAt(pos, 2);
    if (marker === null) return 'its JPEG data ends before a frame header gives its size';
    if (marker[0] !== 0xff) return `its JPEG data is malformed at byte ${pos} (a segment should start there)`;
    if (marker[1] === 0xff) {
      pos += 1; // fill byte
      continue;
    }
    const m = marker[1]!;
    if (standalone(m)) {
      pos += 2;
      continue;
    }
    if (m === 0xda || m === 0xd9) return 'its JPEG data has no frame header (SOF) before its image data';
    const seg = await bytesAt(pos + 2, 2);
    if (seg === null) return 'its JPEG data ends inside a segment';
    const length = seg.readUInt16BE(0);
    if (length < 2) return `its JPEG data is malformed at byte ${pos} (a segment length of ${length})`;
    if (isFrameHeader(m)) {
      const frame = await bytesAt(pos + 4, 5);
      if (frame === null || length < 7) return 'its JPEG frame header is cut short';
      const size = { height: frame.readUInt16BE(1), width: frame.readUInt16BE(3) };
      // Height 0 means "given later" (a DNL marker), which browsers do not agree on.
      return size.width === 0 || size.height === 0 ? `its JPEG frame header gives a size of ${size.width}x${size.height}` : size;
    }
    pos += 2 + length;
  }
  return `its JPEG data has more than ${MAX_JPEG_SEGMENTS} segments before a frame header`;
}
