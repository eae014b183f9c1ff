/**
 * The host's offered images' pixel sizes are checked at startup from their headers (security
 * review, issue 51 finding 7c): a PNG or JPEG whose header claims more than MAX_IMAGE_SIDE on a
 * side (a decompression bomb: a few KB that decode to gigabytes in every tab) stops the start,
 * naming the file, its size, the bound and what to do.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { ServerStartError, startServer } from '../signaling/server.ts';
import { MAX_IMAGE_SIDE, readImageSize } from '../signaling/image_size.ts';
import { encodePng, writeImageFolder } from './fixtures/user_files.ts';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'image-size-test-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A small real PNG whose IHDR (CRC and all, as a crafted file would have) claims `width` x `height`. */
function pngClaiming(width: number, height: number): Buffer {
  const png = Buffer.from(encodePng(1, 1, new Uint8Array(3)));
  png.writeUInt32BE(width, 16);
  png.writeUInt32BE(height, 20);
  png.writeUInt32BE(crc32(png.subarray(12, 29)), 29);
  return png;
}

/** A JPEG's header: SOI, fill bytes, an APP0 (JFIF) and a big APP1 before the frame header `sof` of `width` x `height`, then SOS. */
function jpegClaiming(width: number, height: number, sof = 0xc0): Buffer {
  const segment = (marker: number, payload: Buffer) => {
    const head = Buffer.from([0xff, marker, 0, 0]);
    head.writeUInt16BE(payload.length + 2, 2);
    return Buffer.concat([head, payload]);
  };
  const frame = Buffer.alloc(6 + 3 * 3);
  frame[0] = 8;
  frame.writeUInt16BE(height, 1);
  frame.writeUInt16BE(width, 3);
  frame[5] = 3;
  return Buffer.concat([
    Buffer.from([0xff, 0xd8]),
    segment(0xe0, Buffer.from('JFIF\0\x01\x01\0\0\x01\0\x01\0\0', 'latin1')),
    segment(0xe1, Buffer.alloc(65_000, 0xc0)), // EXIF-sized, past the first read window, full of bytes that look like SOF markers
    Buffer.from([0xff, 0xff]), // fill bytes before a marker are allowed
    segment(0xdb, Buffer.alloc(65)),
    segment(sof, frame),
    segment(0xda, Buffer.alloc(10)),
    Buffer.from([0xff, 0xd9]),
  ]);
}

async function startRefusal(dataPath: string): Promise<string> {
  const err = await startServer({ port: 0, log: () => {}, offer: { dataPath } }).then(
    async (s) => {
      await s.close();
      return new Error('the server started');
    },
    (e: unknown) => e as Error,
  );
  expect(err).toBeInstanceOf(ServerStartError);
  return err.message;
}

describe('offered image sizes', () => {
  it('refuses to start with a PNG whose header claims 100000x100000 pixels, naming the file, its size, the bound and what to do', async () => {
    const images = join(dir, 'bomb');
    await writeImageFolder(images, ['cat', 'dog'], 2);
    await writeFile(join(images, 'dog', 'bomb.png'), pngClaiming(100_000, 100_000));
    const message = await startRefusal(images);
    expect(message).toMatch(
      /--data .*bomb: dog\/bomb\.png is 100000x100000 pixels; images of at most 4096x4096 are offered .*: resize it .* or leave it out/,
    );
  });

  it('refuses a JPEG too wide, found past its other segments; starts with images within the bound', async () => {
    const wide = join(dir, 'wide');
    await writeImageFolder(wide, ['cat', 'dog'], 2);
    await writeFile(join(wide, 'cat', 'wide.jpg'), jpegClaiming(MAX_IMAGE_SIDE + 1, 10, 0xc2));
    expect(await startRefusal(wide)).toMatch(/cat\/wide\.jpg is 4097x10 pixels/);

    const fine = join(dir, 'fine');
    await writeImageFolder(fine, ['cat', 'dog'], 2);
    await writeFile(join(fine, 'cat', 'edge.png'), pngClaiming(MAX_IMAGE_SIDE, MAX_IMAGE_SIDE));
    await writeFile(join(fine, 'dog', 'photo.jpg'), jpegClaiming(640, 480));
    const server = await startServer({ port: 0, log: () => {}, offer: { dataPath: fine } });
    await server.close();
  });

  it('reads sizes from headers alone, and says why a header gives none', async () => {
    const at = (name: string, bytes: Buffer) => writeFile(join(dir, name), bytes).then(() => join(dir, name));
    expect(await readImageSize(await at('a.png', pngClaiming(7, 5)), 'png')).toEqual({ width: 7, height: 5 });
    expect(await readImageSize(await at('b.jpg', jpegClaiming(640, 480)), 'jpeg')).toEqual({ width: 640, height: 480 });
    expect(await readImageSize(await at('c.jpg', jpegClaiming(30, 20, 0xc1)), 'jpeg')).toEqual({ width: 30, height: 20 });
    expect(await readImageSize(await at('d.jpg', jpegClaiming(640, 0)), 'jpeg')).toMatch(/frame header gives a size of 640x0/);
    expect(await readImageSize(await at('e.jpg', Buffer.from([0xff, 0xd8, 0xff, 0xda, 0, 2, 0xff, 0xd9])), 'jpeg')).toMatch(
      /no frame header \(SOF\) before its image data/,
    );
    expect(await readImageSize(await at('f.jpg', Buffer.from([0xff, 0xd8, 0xff, 0xe0, 0x40])), 'jpeg')).toMatch(/ends inside a segment/);
    expect(await readImageSize(await at('g.png', pngClaiming(1, 1).subarray(0, 20)), 'png')).toMatch(/IHDR\) is missing or cut short/);
  });
});
