/**
 * The PyTorch export writes Python that a host imports, from names and strings in a file anyone can
 * craft (a checkpoint, a model.json, its file name). A layer or weight name outside TF.js's own
 * name pattern is refused, naming the name, the file and the pattern, before anything is written;
 * every string from the file goes into the Python file as an escaped literal, so Python's own
 * parser sees exactly the module's statements whatever the file name holds.
 */
import * as tf from '@tensorflow/tfjs';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { modelArtifacts } from '../src/checkpoint/state_dict.ts';
import {
  exportForTorch,
  importTorchStateDict,
  pythonString,
  TorchExportNameError,
  type ModelArtifactsLike,
} from '../src/checkpoint/torch_export.ts';
import { errorOf } from './fixtures/errors.ts';

const PYTHON = '/usr/bin/python3';

/**
 * Why the Python checks cannot run here, or undefined. They need only python3 (no torch); they skip
 * where it is missing, unless DDP_REQUIRE_ALL_TESTS is set (CI), where a missing python3 fails
 * (the pattern of test/fixtures/torch.ts).
 */
function pythonBlocked(): string | undefined {
  try {
    execFileSync(PYTHON, ['-c', 'import ast, json, tokenize'], { stdio: 'pipe', timeout: 60_000 });
    return undefined;
  } catch {
    const reason = `needs ${PYTHON}`;
    if (process.env.DDP_REQUIRE_ALL_TESTS)
      throw new Error(`${reason}, and DDP_REQUIRE_ALL_TESTS is set: CI must run these tests, not skip them`);
    return reason;
  }
}

let dir: string;
let artifacts: ModelArtifactsLike;

beforeAll(async () => {
  await tf.setBackend('cpu');
  dir = await mkdtemp(join(tmpdir(), 'torch-injection-'));
  const model = tf.sequential({
    layers: [
      tf.layers.dense({ inputShape: [4], units: 3, activation: 'relu', name: 'hidden' }),
      tf.layers.dense({ units: 2, name: 'head' }),
    ],
  });
  artifacts = await modelArtifacts(model);
  model.dispose();
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** The artifacts with layer `from` renamed `to`, in the topology and in its weights' names, as a crafted file would hold them. */
function renamed(from: string, to: string): ModelArtifactsLike {
  const topology = structuredClone(artifacts.modelTopology) as { config: { layers: Array<{ config: { name: string } }> } };
  for (const layer of topology.config.layers) if (layer.config.name === from) layer.config.name = to;
  const weightSpecs = artifacts.weightSpecs.map((s) =>
    s.name.startsWith(`${from}/`) ? { ...s, name: `${to}${s.name.slice(from.length)}` } : s,
  );
  return { modelTopology: topology, weightSpecs, weightData: artifacts.weightData };
}

const marker = () => join(dir, 'pwned');
const payload = () => `dense\nimport os; os.system('touch ${marker()}')`;

describe('export to PyTorch: names from the file', () => {
  it('refuses a layer name holding a newline and Python, naming the name, the file and the pattern', () => {
    const source = 'checkpoint evil.ckpt (step 3)';
    const crafted = renamed('hidden', payload());
    expect(() => exportForTorch(crafted, { source })).toThrow(
      `cannot export to PyTorch: the layer name ${JSON.stringify(payload())} in "checkpoint evil.ckpt (step 3)" is not a valid TF.js name (/^[A-Za-z0-9][-A-Za-z0-9._/]*$/: a letter or digit, then letters, digits, - . _ /)`,
    );
    const refusal = (() => {
      try {
        exportForTorch(crafted, { source });
      } catch (e) {
        return e;
      }
    })();
    expect(refusal).toBeInstanceOf(TorchExportNameError);
    const e = refusal as TorchExportNameError;
    expect([e.kind, e.invalidName, e.file, e.message.includes('\n')]).toEqual(['layer', payload(), source, false]);
    // The reverse reads the same topology: refused too.
    expect(() => importTorchStateDict(crafted, new Uint8Array(8))).toThrow(
      errorOf(TorchExportNameError, /the layer name "dense\\nimport os.* is not a valid TF.js name/),
    );
  });

  it('refuses a weight name outside the pattern, and names outside it of every kind; accepts what TF.js accepts', () => {
    const badWeight = {
      ...artifacts,
      weightSpecs: artifacts.weightSpecs.map((s, i) => (i === 0 ? { ...s, name: 'hidden/kernel\nimport os' } : s)),
    };
    expect(() => exportForTorch(badWeight, { source: 'model.json' })).toThrow(
      errorOf(
        TorchExportNameError,
        'cannot export to PyTorch: the weight name "hidden/kernel\\nimport os" in "model.json" is not a valid TF.js name',
      ),
    );
    for (const bad of ['', '_hidden', 'a b', 'a"b', 'a\\b', 'a#b', "a'b", 'a)b', 'dense\u2028x', 'dense\rx', 'dénse']) {
      expect(() => exportForTorch(renamed('hidden', bad)), JSON.stringify(bad)).toThrow(TorchExportNameError);
    }
    const numeric = structuredClone(artifacts.modelTopology) as { config: { layers: Array<{ config: { name: unknown } }> } };
    numeric.config.layers[1]!.config.name = 42;
    expect(() => exportForTorch({ ...artifacts, modelTopology: numeric })).toThrow(
      errorOf(TorchExportNameError, 'the layer name 42 is not a valid TF.js name'),
    );
    for (const good of ['my.layer-1', 'block/dense_2', '0dense']) {
      expect(exportForTorch(renamed('hidden', good)).python, good).toContain(`# TF.js layer "${good}"`);
    }
  });

  it('the CLI refuses a crafted model.json and writes nothing', async () => {
    const crafted = renamed('hidden', payload());
    const folder = join(dir, 'cli');
    await rm(folder, { recursive: true, force: true });
    await mkdir(folder);
    await writeFile(join(folder, 'weights.bin'), new Uint8Array(crafted.weightData));
    await writeFile(
      join(folder, 'model.json'),
      JSON.stringify({ modelTopology: crafted.modelTopology, weightsManifest: [{ paths: ['weights.bin'], weights: crafted.weightSpecs }] }),
    );
    const out = join(folder, 'out');
    let status: number | null = 0;
    let stderr = '';
    try {
      execFileSync(
        process.execPath,
        ['--import', 'tsx', join(import.meta.dirname, '..', 'launcher', 'export_torch.ts'), join(folder, 'model.json'), '--out', out],
        { stdio: 'pipe', timeout: 60_000 },
      );
    } catch (e) {
      ({ status } = e as { status: number | null });
      stderr = String((e as { stderr: Buffer }).stderr);
    }
    expect(stderr).toContain(
      `export:torch: cannot export to PyTorch: the layer name ${JSON.stringify(payload())} in "model.json" is not a valid TF.js name`,
    );
    expect(status).toBe(1);
    expect(existsSync(out)).toBe(false);
    expect(existsSync(marker())).toBe(false);
  }, 60_000);
});

const blocked = pythonBlocked();

describe.skipIf(blocked !== undefined)(
  `export to PyTorch: Python's parser sees only the module${blocked ? ` (skipped: ${blocked})` : ''}`,
  () => {
    // What the Python file is, statement by statement at its top level.
    const STATEMENTS = [
      'Expr:str', // the docstring
      'Import:json',
      'Import:math',
      'Import:struct',
      'ImportFrom:collections:OrderedDict',
      'Import:torch',
      'ImportFrom:torch:nn',
      'ClassDef:Model',
      'Assign:_DTYPES',
      'FunctionDef:load_file',
      "If:__name__ == '__main__'",
    ];

    // Reads a Python file: its top-level statements, its docstring, every identifier in it, and
    // every token (of any kind but a string literal) holding one of the markers.
    const CHECK = `
import ast, io, json, sys, tokenize
path, markers = sys.argv[1], json.loads(sys.argv[2])
src = open(path, encoding="utf-8").read()
try:
    tree = ast.parse(src, path)
except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the source
    print(json.dumps({"syntaxError": str(e)}))
    sys.exit(0)
def describe(s):
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
        return "Expr:str"
    if isinstance(s, ast.Import):
        return "Import:" + ",".join(a.name for a in s.names)
    if isinstance(s, ast.ImportFrom):
        return "ImportFrom:%s:%s" % (s.module, ",".join(a.name for a in s.names))
    if isinstance(s, (ast.ClassDef, ast.FunctionDef)):
        return "%s:%s" % (type(s).__name__, s.name)
    if isinstance(s, ast.Assign):
        return "Assign:" + ",".join(ast.unparse(t) for t in s.targets)
    if isinstance(s, ast.If):
        return "If:" + ast.unparse(s.test)
    return type(s).__name__ + ":" + ast.unparse(s)
names = set()
for n in ast.walk(tree):
    for field in ("id", "attr", "name", "arg", "module"):
        v = getattr(n, field, None)
        if isinstance(v, str):
            names.add(v)
outside = [[tokenize.tok_name[t.type], t.string] for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type != tokenize.STRING and any(m in t.string for m in markers)]
print(json.dumps({"statements": [describe(s) for s in tree.body], "docstring": ast.get_docstring(tree, clean=False), "names": sorted(names), "outside": outside}))
`;

    interface Parsed {
      syntaxError?: string;
      statements?: string[];
      docstring?: string;
      names?: string[];
      outside?: Array<[string, string]>;
    }

    async function parse(python: string, markers: string[]): Promise<Parsed> {
      const file = join(dir, 'model.py');
      await writeFile(file, python);
      return JSON.parse(
        execFileSync(PYTHON, ['-c', CHECK, file, JSON.stringify(markers)], { encoding: 'utf8', timeout: 60_000 }),
      ) as Parsed;
    }

    const MARKERS = ['pwned', 'os.system', 'import os', 'evil'];

    // `""\\"` became `"""` under the old one-pass removal of `"""` and `\\`; the rest: newlines, both
    // quote kinds, a trailing backslash, characters Python reads as line ends or refuses in source.
    const SOURCES = [
      `evil""\\"\nimport os; os.system('touch /tmp/pwned')\n""\\".ckpt`,
      `evil"""\r\nimport os; os.system("touch /tmp/pwned") #'''\\`,
      `evil\\"\\\\"\\"\u2028import os\u0000\x0c\x0bpwned \u{1F600}\ud800 \\`,
    ];

    for (const [i, source] of SOURCES.entries()) {
      it(`a crafted file name (${i + 1} of ${SOURCES.length}) stays a string: exactly the module's statements, the name intact in the docstring`, async () => {
        const out = exportForTorch(artifacts, { source, fileName: `evil"""\nimport os #${i}` });
        const parsed = await parse(out.python, MARKERS);
        expect(parsed.syntaxError).toBeUndefined();
        expect(parsed.statements).toEqual(STATEMENTS);
        expect(parsed.outside).toEqual([]);
        expect(parsed.names).not.toContain('os');
        expect(parsed.names).not.toContain('system');
        expect(parsed.docstring).toContain(`Weights: "${source}"`);
        // The layer names are in comments, quoted; the file name became a module name.
        expect(out.python).toContain('# TF.js layer "hidden"');
        expect(out.python).toContain(`load_file("evil____import_os__${i}.safetensors")`);
      });
    }

    it('pythonString: Python reads back exactly the string, from printable ASCII only', () => {
      const strings = [
        '',
        'plain',
        '"""',
        "'''",
        '\\',
        'a\\',
        '\\"',
        '\n\r\t\0\x7f\x0b\x0c',
        '\u0085\u2028\u2029',
        'é ü 中文',
        '\u{1F600}',
        '\ud800',
        `${'"'.repeat(7)}\\`,
      ];
      const literals = strings.map(pythonString);
      for (const l of literals) expect(l).toMatch(/^"[\x20-\x7e]*"$/);
      const back = JSON.parse(
        execFileSync(
          PYTHON,
          [
            '-c',
            'import ast, json, sys; print(json.dumps([ast.literal_eval(s) for s in json.loads(sys.argv[1])]))',
            JSON.stringify(literals),
          ],
          { encoding: 'utf8', timeout: 60_000 },
        ),
      ) as string[];
      expect(back).toEqual(strings);
    });
  },
);
