/**
 * The language model's PyTorch export carries its vocabulary: real PyTorch (Debian's
 * python3-torch) imports the .py, encodes and decodes text (quotes, backslashes, newlines and
 * characters outside ASCII among the vocabulary) and its `generate` writes, at temperature 0, the
 * characters the tab's own `generate` writes. The vocabulary is untrusted (a checkpoint's meta):
 * anything but one distinct character per token id is refused, and it stays data in the file.
 * The CLI takes it from a checkpoint's meta, a model.json's userDefinedMetadata, or --text.
 */
import * as tf from '@tensorflow/tfjs';
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildModel } from '../src/nn/models.ts';
import { buildLanguageModel, CharTokenizer, generate } from '../src/nn/language_model.ts';
import { modelArtifacts } from '../src/checkpoint/state_dict.ts';
import { exportForTorch, TorchExportError } from '../src/checkpoint/torch_export.ts';
import { encodeCheckpoint } from '../src/checkpoint/checkpoint_format.ts';
import { torchTestsBlocked } from './fixtures/torch.ts';
import { errorOf } from './fixtures/errors.ts';

// A corpus whose characters are the awkward ones for a Python file: quotes, a backslash, a
// newline, a tab, a NUL-free control, characters beyond ASCII and beyond the BMP.
const CORPUS = 'Call me Ishmael. "Quote" \'single\' back\\slash\nnew line\ttab é 漢 😀 }]) #';
const tokenizer = CharTokenizer.fromText(CORPUS);
const CONTEXT = 12;

let model: tf.LayersModel;
let dir: string;

beforeAll(async () => {
  await tf.setBackend('cpu');
  model = buildLanguageModel({ vocabSize: tokenizer.vocabSize, contextLength: CONTEXT, dModel: 16, heads: 2, blocks: 2, seed: 3 });
  // Large, distinct weights: the most likely character is far ahead of the next, in torch as in TF.js.
  const values = model.weights.map((w, i) => tf.randomUniform(w.shape as number[], -1, 1, 'float32', 50 + i));
  model.setWeights(values);
  tf.dispose(values);
  dir = await mkdtemp(join(tmpdir(), 'torch-export-text-'));
});

afterAll(async () => {
  model.dispose();
  await rm(dir, { recursive: true, force: true });
});

describe('the vocabulary in the export', () => {
  it('is refused unless it is one distinct character per token id of a token model, saying why', async () => {
    const artifacts = await modelArtifacts(model);
    const refused = (vocabulary: unknown) => {
      try {
        exportForTorch(artifacts, { vocabulary: vocabulary as string[] });
      } catch (err) {
        expect(err).toBeInstanceOf(TorchExportError);
        return (err as Error).message;
      }
      throw new Error(`accepted ${JSON.stringify(vocabulary)}`);
    };
    expect(refused(tokenizer.chars.slice(1))).toContain(
      `the vocabulary has ${tokenizer.vocabSize - 1} characters; the model's embedding has ${tokenizer.vocabSize} token ids`,
    );
    expect(refused(['"]\nimport os\nos.system("x")#', ...tokenizer.chars.slice(1)])).toContain('vocabulary entry 0 must be one character');
    expect(refused([tokenizer.chars[1], ...tokenizer.chars.slice(1)])).toContain('vocabulary entry 1 ');
    expect(refused([7, ...tokenizer.chars.slice(1)])).toContain('vocabulary entry 0 must be one character, got 7');
    expect(refused('abc')).toContain('must be a list of characters');
    const mlp = buildModel({ kind: 'mlp', inputShape: [4], numClasses: 2, seed: 1, hidden: 4 });
    const mlpOut = await modelArtifacts(mlp);
    expect(() => exportForTorch(mlpOut, { vocabulary: ['a', 'b'] })).toThrow(errorOf(TorchExportError, /only a language model takes one/));
    mlp.dispose();
  });
});

const blocked = torchTestsBlocked();

describe.skipIf(blocked !== undefined)(`in real PyTorch${blocked ? ` (skipped: ${blocked})` : ''}`, () => {
  it("encodes and decodes every character, and generate writes, at temperature 0, what the tab's generate writes", async () => {
    const exported = exportForTorch(await modelArtifacts(model), { vocabulary: tokenizer.chars, fileName: 'lm' });
    await writeFile(join(dir, 'lm.safetensors'), exported.safetensors);
    await writeFile(join(dir, 'lm.py'), exported.python);
    // Short of the context (the window grows) and past it (the last CONTEXT characters).
    const prompt = 'Call me';
    const greedy = tokenizer.decode(await generate(model, tokenizer.encode(prompt), 2 * CONTEXT, { temperature: 0 }));
    await writeFile(join(dir, 'case.json'), JSON.stringify({ text: CORPUS, prompt, n: 2 * CONTEXT }));
    const script = `
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from lm import Model, load_file, encode, decode, generate, VOCABULARY
case = json.load(open(sys.argv[1] + "/case.json", encoding="utf-8"))
model = Model()
model.load_state_dict(load_file(sys.argv[1] + "/lm.safetensors"))
model.eval()
ids = encode(case["text"])
try:
    encode("\\u00ff")
    outside = "accepted"
except ValueError as e:
    outside = str(e)
g = torch.Generator().manual_seed(0)
sampled = generate(model, case["prompt"], case["n"], temperature=0.8, generator=g)
out = {"vocabulary": VOCABULARY, "ids": ids.tolist(), "dtype": str(ids.dtype), "decoded": decode(ids), "greedy": generate(model, case["prompt"], case["n"], temperature=0), "sampled": sampled, "outside": outside}
json.dump(out, open(sys.argv[1] + "/text_out.json", "w", encoding="utf-8"))
`;
    execFileSync('/usr/bin/python3', ['-c', script, dir], { stdio: 'pipe', timeout: 120_000 });
    const out = JSON.parse(await readFile(join(dir, 'text_out.json'), 'utf8')) as Record<string, unknown>;
    expect(out.vocabulary).toEqual(tokenizer.chars);
    expect(out.ids).toEqual(Array.from(tokenizer.encode(CORPUS)));
    expect(out.dtype).toBe('torch.int64');
    expect(out.decoded).toBe(CORPUS);
    expect(out.greedy).toBe(prompt + greedy);
    const sampled = out.sampled as string;
    expect(Array.from(sampled).length).toBe(Array.from(prompt).length + 2 * CONTEXT);
    expect(Array.from(sampled).every((c) => tokenizer.chars.includes(c))).toBe(true);
    expect(out.outside).toBe(`character 'ÿ' at 0 is not in the model's vocabulary of ${tokenizer.vocabSize}`);
  }, 120_000);

  it('the CLI writes the vocabulary from a checkpoint, a model.json and --text, and says when it has none', async () => {
    const artifacts = await modelArtifacts(model);
    const cli = (file: string, out: string, ...more: string[]) =>
      execFileSync(
        process.execPath,
        ['--import', 'tsx', join(import.meta.dirname, '..', 'launcher', 'export_torch.ts'), file, '--out', out, ...more],
        { stdio: 'pipe', timeout: 60_000 },
      ).toString();
    const vocabularyOf = (folder: string) =>
      execFileSync(
        '/usr/bin/python3',
        ['-c', 'import json, sys; sys.path.insert(0, sys.argv[1]); import model; print(json.dumps(model.VOCABULARY))', folder],
        { stdio: 'pipe', timeout: 120_000 },
      ).toString();

    const ckpt = join(dir, 'run.ckpt');
    await writeFile(
      ckpt,
      await encodeCheckpoint({
        meta: { step: 3, user: { config: {}, vocabulary: tokenizer.chars } },
        model: artifacts,
        optimizer: { weightSpecs: [], weightData: new ArrayBuffer(0) },
      }),
    );
    expect(cli(ckpt, join(dir, 'from-ckpt'))).toContain(`text: a vocabulary of ${tokenizer.vocabSize} characters`);
    expect(JSON.parse(vocabularyOf(join(dir, 'from-ckpt')))).toEqual(tokenizer.chars);

    await writeFile(join(dir, 'w.bin'), new Uint8Array(artifacts.weightData));
    const json = join(dir, 'lm.json');
    await writeFile(
      json,
      JSON.stringify({
        modelTopology: artifacts.modelTopology,
        weightsManifest: [{ paths: ['w.bin'], weights: artifacts.weightSpecs }],
        userDefinedMetadata: { vocabulary: tokenizer.chars },
      }),
    );
    cli(json, join(dir, 'from-json'));
    expect(JSON.parse(vocabularyOf(join(dir, 'from-json')))).toEqual(tokenizer.chars);

    const bare = join(dir, 'bare.json');
    await writeFile(
      bare,
      JSON.stringify({ modelTopology: artifacts.modelTopology, weightsManifest: [{ paths: ['w.bin'], weights: artifacts.weightSpecs }] }),
    );
    expect(cli(bare, join(dir, 'bare-out'))).toContain(
      'this file carries no vocabulary; give the text the model trained on with --text FILE',
    );
    const corpus = join(dir, 'corpus.txt');
    await writeFile(corpus, CORPUS);
    cli(bare, join(dir, 'from-text'), '--text', corpus);
    expect(JSON.parse(vocabularyOf(join(dir, 'from-text')))).toEqual(tokenizer.chars);
  }, 240_000);
});
