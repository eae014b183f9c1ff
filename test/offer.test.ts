/**
 * The host's own model and data (npm start -- --model DIR --data DIR|FILE.csv; signaling/offer.ts),
 * on the real server over HTTP: bad files are refused at startup naming the file (and the line),
 * the routes answer only a session's token, and an item is asked for by index, never by path.
 */
import * as tf from '@tensorflow/tfjs';
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rename, rm, symlink, truncate, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, ServerStartError, PROJECT_ROOT, type RunningServer } from '../signaling/server.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import type { OfferOptions } from '../signaling/offer.ts';
import { writeImageFolder, writeModelFolder, userImageModel } from './fixtures/user_files.ts';

let dir: string;
beforeAll(async () => {
  await tf.setBackend('cpu');
  dir = await mkdtemp(join(tmpdir(), 'offer-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function refusal(offer: OfferOptions): Promise<string> {
  const err = await startServer({ port: 0, log: () => {}, checkpointDir: join(dir, 'ckpt'), offer }).then(
    async (s) => {
      await s.close();
      return new Error('the server started');
    },
    (e: unknown) => e as Error,
  );
  expect(err).toBeInstanceOf(ServerStartError);
  return err.message;
}

describe('what the host offers is checked when the server starts', () => {
  it('refuses bad images, a ragged CSV, a broken model and a model that does not fit the data, naming the file', async () => {
    const images = join(dir, 'images');
    await writeImageFolder(images, ['cat', 'dog'], 3);
    await writeFile(join(images, 'dog', 'notes.txt'), 'not an image');
    expect(await refusal({ dataPath: images })).toMatch(/--data .*images: dog\/notes\.txt is not a PNG or JPEG image/);

    const csv = join(dir, 'flowers.csv');
    await writeFile(csv, 'a,b,species\n1,2,x\n3,4\n5,6,y\n');
    expect(await refusal({ dataPath: csv, labelColumn: 'species' })).toMatch(/--data .*flowers\.csv: .*line 3/);

    const model = join(dir, 'model');
    await writeModelFolder(model, userImageModel(3));
    const good = join(dir, 'good');
    await writeImageFolder(good, ['red', 'green'], 2);
    expect(await refusal({ modelDir: model, dataPath: good })).toMatch(
      /has 3 outputs, --data .*good 2 classes: the model's last layer must have one unit per class/,
    );

    // A text, for the language model: UTF-8 (the line of a bad byte named), long enough, a vocabulary of characters, no --model beside it.
    const latin1 = join(dir, 'latin1.txt');
    await writeFile(latin1, Buffer.concat([Buffer.from('line one\nline two\ncaf'), Buffer.from([0xe9]), Buffer.from('\n'.repeat(3))]));
    expect(await refusal({ dataPath: latin1 })).toMatch(/--data .*latin1\.txt: line 3 is not UTF-8 text/);
    const short = join(dir, 'short.txt');
    await writeFile(short, 'Call me Ishmael.');
    expect(await refusal({ dataPath: short })).toMatch(/16 characters; the language model needs a text of at least 2000/);
    const cjk = join(dir, 'many.txt');
    await writeFile(cjk, Array.from({ length: 3000 }, (_, i) => String.fromCodePoint(0x4e00 + i)).join(''));
    expect(await refusal({ dataPath: cjk })).toMatch(/3000 distinct characters; the character-level model takes at most 1024/);
    const story = join(dir, 'story.txt');
    await writeFile(story, 'the cat sat on the mat. '.repeat(100));
    expect(await refusal({ modelDir: model, dataPath: story })).toMatch(
      /is a text, which trains the built-in language model \(model lm\); leave out --model/,
    );
    expect(await refusal({ dataPath: join(dir, 'notes.md') })).toMatch(/no such file/);

    await truncate(join(model, 'weights.bin'), 100);
    expect(await refusal({ modelDir: model })).toMatch(/the weight files hold 100 bytes, model\.json's manifest \d+: a file is truncated/);
    expect(await refusal({ modelDir: join(dir, 'nowhere') })).toMatch(/model\.json: not found/);
  });

  it('refuses a symbolic link among the offered files (a weight file, model.json, an image, a class folder), naming it and saying what to do', async () => {
    // Security review, issue 51, finding 6: a link's target would go to every holder of a session's token.
    const outside = join(dir, 'outside');
    await mkdir(outside, { recursive: true });
    const model = join(dir, 'linked-weights');
    await writeModelFolder(model, userImageModel(3));
    // The very bytes the manifest expects, outside the folder: only the link is wrong.
    await rename(join(model, 'weights.bin'), join(outside, 'secret.bin'));
    await symlink(join(outside, 'secret.bin'), join(model, 'weights.bin'));
    expect(await refusal({ modelDir: model })).toMatch(
      /^--model .*linked-weights: weight file \.\/weights\.bin \(named in model\.json\) is a symbolic link \(to .*outside\/secret\.bin\); the server offers only regular files inside the folder you name \(.*every holder of a session's token\): copy the file into the folder in place of the link$/,
    );

    const json = join(dir, 'linked-json');
    await writeModelFolder(json, userImageModel(3));
    await rename(join(json, 'model.json'), join(outside, 'model.json'));
    await symlink(join(outside, 'model.json'), join(json, 'model.json'));
    expect(await refusal({ modelDir: json })).toMatch(
      /--model .*linked-json: .*model\.json is a symbolic link \(to .*outside\/model\.json\); .*copy the file into the folder in place of the link/,
    );

    const images = join(dir, 'linked-images');
    await writeImageFolder(images, ['cat', 'dog'], 2);
    await rename(join(images, 'dog', '001.png'), join(outside, 'dog.png'));
    await symlink(join(outside, 'dog.png'), join(images, 'dog', '001.png'));
    expect(await refusal({ dataPath: images })).toMatch(
      /^--data .*linked-images: dog\/001\.png is a symbolic link \(to .*outside\/dog\.png\); the server offers only regular files inside the folder you name .*: copy the file into the folder in place of the link$/,
    );

    const classes = join(dir, 'linked-class');
    await writeImageFolder(classes, ['cat', 'dog'], 2);
    await writeImageFolder(join(outside, 'birds'), ['bird'], 2);
    await symlink(join(outside, 'birds', 'bird'), join(classes, 'bird'));
    expect(await refusal({ dataPath: classes })).toMatch(
      /^--data .*linked-class: bird is a symbolic link \(to .*outside\/birds\/bird\); .*: copy the class folder into the data folder in place of the link$/,
    );

    // The folder the host names may itself be a link (theirs to follow); what lies in it may not.
    const good = join(dir, 'good-images');
    await writeImageFolder(good, ['cat', 'dog'], 2);
    const named = join(dir, 'named-link');
    await symlink(good, named);
    const server = await startServer({ port: 0, log: () => {}, checkpointDir: join(dir, 'ckpt'), offer: { dataPath: named } });
    try {
      expect(server.offered.data).toMatchObject({ kind: 'images', length: 4 });
    } finally {
      await server.close();
    }
  });

  it('an image replaced by a link after the start is not followed when a tab asks for it (410)', async () => {
    const images = join(dir, 'swapped-images');
    await writeImageFolder(images, ['cat', 'dog'], 2);
    const server = await startServer({ port: 0, log: () => {}, checkpointDir: join(dir, 'ckpt'), offer: { dataPath: images } });
    try {
      const session = 'swapped';
      const token = newSessionToken();
      await server.createSession(session, token);
      const get = (i: number) =>
        fetch(`http://127.0.0.1:${server.port}/api/offer/data/${i}?session=${session}`, { headers: { authorization: `Bearer ${token}` } });
      const first = await get(0);
      expect(first.status).toBe(200);
      expect(Buffer.from(await first.arrayBuffer()).equals(await readFile(join(images, 'cat', '000.png')))).toBe(true);
      const secret = join(dir, 'swap-secret.png');
      await writeFile(secret, "the host's private bytes");
      await unlink(join(images, 'cat', '000.png'));
      await symlink(secret, join(images, 'cat', '000.png'));
      const swapped = await get(0);
      expect(swapped.status).toBe(410);
      expect(((await swapped.json()) as { message: string }).message).toMatch(
        /cat\/000\.png was offered at startup and cannot be read now \(or is no longer a regular file\)/,
      );
    } finally {
      await server.close();
    }
  });

  it('a text is offered whole, as UTF-8, with its size and vocabulary', async () => {
    const story = join(dir, 'tale.txt');
    const text = 'the whale sang to the moon, and the sea sang back. '.repeat(60);
    await writeFile(story, text);
    const server = await startServer({ port: 0, log: () => {}, checkpointDir: join(dir, 'ckpt'), offer: { dataPath: story } });
    try {
      const session = 'tale';
      const token = newSessionToken();
      await server.createSession(session, token);
      const get = (path: string) =>
        fetch(`http://127.0.0.1:${server.port}${path}?session=${session}`, { headers: { authorization: `Bearer ${token}` } });
      expect(((await (await get('/api/offer')).json()) as { data: unknown }).data).toEqual({
        kind: 'text',
        name: 'tale.txt',
        classes: new Set(text).size,
        length: text.length,
        inputShape: null,
      });
      expect(await (await get('/api/offer/data')).json()).toEqual({ kind: 'text', name: 'tale.txt', characters: text.length });
      const body = await get('/api/offer/data/0');
      expect(body.headers.get('content-type')).toBe('text/plain; charset=utf-8');
      expect(await body.text()).toBe(text);
      expect((await get('/api/offer/data/1')).status).toBe(404);
    } finally {
      await server.close();
    }
  });

  it('npm start says what was wrong and exits 1', async () => {
    const { code, stderr } = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
      execFile(
        'npx',
        ['tsx', 'signaling/main.ts', '--data', join(dir, 'missing')],
        { cwd: PROJECT_ROOT, env: { ...process.env, PORT: '0', CHECKPOINT_DIR: join(dir, 'ckpt') }, timeout: 60_000 },
        (err, _out, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stderr }),
      );
    });
    expect(code).toBe(1);
    expect(stderr).toContain('--data');
    expect(stderr).toContain('no such file or folder');
  }, 60_000);
});

describe('the offer routes', () => {
  let server: RunningServer;
  const session = 'offer-routes';
  const token = newSessionToken();
  beforeAll(async () => {
    const model = join(dir, 'route-model');
    await writeModelFolder(model, userImageModel(3));
    const images = join(dir, 'route-images');
    await writeImageFolder(images, ['blue', 'green', 'red'], 2);
    server = await startServer({ port: 0, log: () => {}, checkpointDir: join(dir, 'ckpt'), offer: { modelDir: model, dataPath: images } });
    await server.createSession(session, token);
  });
  afterAll(async () => {
    await server?.close();
  });
  const get = (path: string, auth?: string) =>
    fetch(`http://127.0.0.1:${server.port}${path}`, { headers: auth ? { authorization: `Bearer ${auth}` } : {} });

  it("answer the session's token only", async () => {
    expect((await get(`/api/offer?session=${session}`)).status).toBe(401);
    const wrong = await get(`/api/offer?session=${session}`, newSessionToken());
    expect(wrong.status).toBe(403);
    expect(((await wrong.json()) as { message: string }).message).toMatch(/this token is not that session's/);
    expect((await get('/api/offer/model', token)).status).toBe(400); // no session named
    // Without a token, the server says only that it offers a model and data (the create form offers "user" then), never what they are.
    expect(((await (await get('/api/info')).json()) as { offers: unknown }).offers).toEqual({ model: true, data: true });
  });

  it('say what is offered, and serve the model and each image by index', async () => {
    const info = (await (await get(`/api/offer?session=${session}`, token)).json()) as {
      model: { inputShape: number[]; outputUnits: number };
      data: { kind: string; classes: string[]; length: number };
    };
    expect(info.model).toMatchObject({ inputShape: [12, 12, 3], outputUnits: 3 });
    expect(info.data).toMatchObject({ kind: 'images', classes: ['blue', 'green', 'red'], length: 6 });
    const manifest = (await (await get(`/api/offer/data?session=${session}`, token)).json()) as {
      items: Array<{ file: string; label: number }>;
    };
    expect(manifest.items[0]).toEqual({ file: 'blue/000.png', label: 0 });
    const image = await get(`/api/offer/data/5?session=${session}`, token);
    expect(image.headers.get('content-type')).toBe('image/png');
    expect(new Uint8Array(await image.arrayBuffer()).subarray(1, 4)).toEqual(new Uint8Array([0x50, 0x4e, 0x47]));
    for (const bad of ['6', '-1', '..%2F..%2Fetc%2Fpasswd', '1.5'])
      expect((await get(`/api/offer/data/${bad}?session=${session}`, token)).status).toBe(404);
    const weights = await get(`/api/offer/model/weights?session=${session}`, token);
    expect((await weights.arrayBuffer()).byteLength).toBe((3 * 3 * 3 * 4 + 4 + 5 * 5 * 4 * 3 + 3) * 4);
    expect(
      (
        await fetch(`http://127.0.0.1:${server.port}/api/offer?session=${session}`, {
          method: 'POST',
          headers: { authorization: `Bearer ${token}` },
        })
      ).status,
    ).toBe(405);
  });
});
