/**
 * The host's own model and data: a TF.js model saved as model.save() writes it (a small
 * Keras-style CNN ending in a softmax) and a folder of PNG images, one sub-folder per class,
 * offered by the server (npm start's --model and --data, the launcher's --model-dir and
 * --data-dir) and trained by 2 real tabs with DDP, and split into 2 pipeline stages; the images
 * are decoded and resized in the tabs.
 * An image that does not decode stops the job naming its file. A text (--data FILE.txt) trains
 * the built-in language model.
 */
import * as tf from '@tensorflow/tfjs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { launch } from '../../launcher/run.ts';
import { userImageModel, writeImageFolder, writeModelFolder } from '../fixtures/user_files.ts';
import { expect, launchCommand, sessionName, test } from './fixtures.ts';

let dir: string;
test.beforeAll(async () => {
  await tf.setBackend('cpu');
  dir = await mkdtemp(join(tmpdir(), 'user-files-'));
  await writeModelFolder(join(dir, 'model'), userImageModel(3));
  await writeImageFolder(join(dir, 'images'), ['blue', 'green', 'red'], 20);
});
test.afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

test("2 tabs train the host's own model on its own image folder (launcher --model-dir, --data-dir); streamed (fetched as the steps need them), to the same weights", async () => {
  // 60 images, every tenth held out: 54 to train, 6 to test; 2 ranks x 6 a step, 5 epochs. Torch's
  // equal shards (no balancing by measured speed, which differs from run to run): the same samples
  // on the same rank at every step, so that the streamed run can match the first one's weights.
  const args = [
    '--nproc',
    '2',
    '--job',
    'train',
    '--model-dir',
    join(dir, 'model'),
    '--data-dir',
    join(dir, 'images'),
    '--backend',
    'cpu',
    '--batch-size',
    '6',
    '--epochs',
    '5',
    '--lr',
    '0.01',
    '--balance',
    'false',
    '--timeout',
    '180',
  ];
  // The images loaded at the start (--stream-data's default for 60 images), then streamed.
  const r = await launchCommand(args);
  expect(r.code, r.output.slice(-3000)).toBe(0);
  const s = r.summary as { worldSize: number; identical: boolean; testAccuracy: number; dataStreamed: boolean; weightHashes: string[] };
  expect(s.worldSize).toBe(2);
  expect(s.identical).toBe(true);
  // Three colours: a model that learned anything gets them; chance is a third.
  expect(s.testAccuracy).toBeGreaterThanOrEqual(5 / 6);
  // The saved softmax moved into the loss, and the tabs said so.
  expect(r.output).toMatch(/the model's last layer "my_classes" had a softmax/);
  expect(s.dataStreamed).toBe(false);

  const streamed = await launchCommand([...args, '--stream-data', 'on']);
  expect(streamed.code, streamed.output.slice(-3000)).toBe(0);
  const t = streamed.summary as typeof s;
  expect(t.dataStreamed).toBe(true);
  expect(new Set(t.weightHashes).size).toBe(1);
  expect(t.weightHashes, 'the streamed run against the one that loaded its images at the start').toEqual(s.weightHashes);
  expect(t.testAccuracy).toBe(s.testAccuracy);
});

test("a script gets the host's model and data from its context (examples/02_ddp_train.ts with --model-dir, --data-dir)", async () => {
  const r = await launchCommand([
    '--nproc',
    '2',
    '--backend',
    'cpu',
    '--model-dir',
    join(dir, 'model'),
    '--data-dir',
    join(dir, 'images'),
    '--timeout',
    '180',
    'examples/02_ddp_train.ts',
    '--batch-size',
    '6',
    '--epochs',
    '4',
  ]);
  expect(r.code, r.output.slice(-3000)).toBe(0);
  expect(r.summary).toMatchObject({ script: 'examples/02_ddp_train.ts', worldSize: 2, ok: true });
  // The offered model (its softmax folded into the loss) on the 60 images of 3 classes, not the built-in MLP and set.
  expect(r.output).toMatch(/\[rank 0\] training \S+ on images \(60 samples, 3 classes\)/);
  expect(r.output).toMatch(/the model's last layer "my_classes" had a softmax/);
  expect(r.summary.finalLoss as number).toBeLessThan(Math.log(3));
});

test("2 tabs train the language model on the host's own text (launcher --data-dir FILE.txt)", async () => {
  // A text of a few sentences over and over: 24 distinct characters, none of them a capital C,
  // so the samples start from the text's own first characters instead of Moby-Dick's "Call me ".
  const sentences = [
    'the whale sang to the moon. ',
    'a gull flew over the bay. ',
    'the sea was calm and grey. ',
    'we rowed home at night. ',
  ];
  const text = Array.from({ length: 240 }, (_, i) => sentences[(i * 7) % 4]).join('');
  const file = join(dir, 'ballad.txt');
  await writeFile(file, text);
  const r = await launchCommand([
    '--nproc',
    '2',
    '--job',
    'train',
    '--data-dir',
    file,
    '--backend',
    'cpu',
    '--hidden',
    '16',
    '--context',
    '16',
    '--batch-size',
    '8',
    '--steps',
    '20',
    // No samples between the evaluations (the default writes one at step 10 and 20, a second each
    // on a loaded machine): the one at the end is what is checked.
    '--first-sample',
    '0',
    '--lr',
    '0.02',
    '--timeout',
    '180',
  ]);
  expect(r.code, r.output.slice(-3000)).toBe(0);
  const s = r.summary as { worldSize: number; identical: boolean; model: string; dataset: string; perplexity: number; sample: string };
  expect(s).toMatchObject({ worldSize: 2, identical: true, model: 'lm', dataset: 'user' });
  const vocabulary = new Set(text).size;
  // Below a uniform guess over the text's characters.
  expect(s.perplexity).toBeLessThan(vocabulary / 2);
  expect(s.sample.startsWith('the whal')).toBe(true);
  expect(new Set(s.sample).size).toBeLessThanOrEqual(vocabulary);
});

test("the host's model split into 2 pipeline stages (a tab each), from its saved weights", async () => {
  // 4 epochs of 9 steps: the test set is all right from the second on.
  const r = await launchCommand([
    '--nproc',
    '2',
    '--pp',
    '2',
    '--micro-batches',
    '2',
    '--job',
    'train',
    '--model-dir',
    join(dir, 'model'),
    '--data-dir',
    join(dir, 'images'),
    '--backend',
    'cpu',
    '--batch-size',
    '6',
    '--epochs',
    '4',
    '--lr',
    '0.01',
    '--timeout',
    '180',
  ]);
  expect(r.code, r.output.slice(-3000)).toBe(0);
  const s = r.summary as { worldSize: number; testAccuracy: number; pipeline: { stages: Array<{ layerClasses: string[] }> } };
  expect(s.worldSize).toBe(2);
  // The saved layers, cut at a layer boundary: every layer in exactly one stage.
  expect(s.pipeline.stages).toHaveLength(2);
  expect(s.pipeline.stages.flatMap((st) => st.layerClasses)).toEqual(['Conv2D', 'MaxPooling2D', 'Flatten', 'Dense']);
  expect(s.testAccuracy).toBeGreaterThanOrEqual(5 / 6);
});

test('an image that does not decode stops the job, naming its file', async () => {
  const images = join(dir, 'broken');
  await writeImageFolder(images, ['a', 'b'], 2);
  // A PNG's signature and a whole IHDR of a 4x4 image (the server's checks pass: its kind and its
  // size), then nothing a decoder can read: only the tab's decoder finds it broken.
  const ihdr = Buffer.concat([Buffer.from('IHDR'), Buffer.from([0, 0, 0, 4, 0, 0, 0, 4, 8, 2, 0, 0, 0])]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(ihdr));
  const length = Buffer.from([0, 0, 0, 13]);
  await writeFile(
    join(images, 'b', 'zz-broken.png'),
    Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), length, ihdr, crc, Buffer.alloc(64, 7)]),
  );
  const lines: string[] = [];
  const { ok } = await launch({
    nproc: 1,
    job: 'train',
    session: sessionName('broken'),
    timeoutSec: 90,
    jobParams: { dataset: 'user', model: 'mlp', backend: 'cpu', epochs: '1' },
    serverOptions: { offer: { dataPath: images } },
    log: (l) => lines.push(l),
  });
  expect(ok).toBe(false);
  expect(lines.join('\n')).toMatch(/image b\/zz-broken\.png cannot be decoded/);
  // Before the images load, the page says what the built-in model makes of them: grey, 0..1.
  expect(lines.join('\n')).toContain("The host's images reach the mlp model as 28x28 grey images (luminance, values 0..1)");
});
