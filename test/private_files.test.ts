/**
 * What the server writes under its data folder is its own user's only (security review, issue 51
 * finding 7b): checkpoints and token hashes 0600, the folders that hold them 0700, including
 * session folders an older version left open (0755).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chmod, mkdir, mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkpointStore, type ByteSource } from '../signaling/checkpoint_store.ts';
import { HOST_FILE, SessionTokens, TOKEN_FILE } from '../signaling/session_tokens.ts';
import { encodeCheckpoint } from '../src/checkpoint/checkpoint_format.ts';
import { tokenFor } from './fixtures/session.ts';

let root: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), 'private-files-test-'));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

const modeOf = async (path: string) => (await stat(path)).mode & 0o777;
const octal = (m: number) => m.toString(8);

/** A small valid checkpoint container, as an upload's body gives it. */
async function upload(): Promise<{ bytes: Uint8Array; source: () => ByteSource }> {
  const bytes = await encodeCheckpoint({
    meta: { step: 1 },
    model: {
      modelTopology: { class_name: 'Sequential', config: { name: 's', layers: [] } },
      weightSpecs: [{ name: 'w', shape: [2], dtype: 'float32' }],
      weightData: new Float32Array([1, 2]).buffer,
    },
    optimizer: { weightSpecs: [], weightData: new ArrayBuffer(0) },
  });
  const all = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return {
    bytes,
    source: () => {
      let sent = false;
      return {
        firstBytes: async () => {
          sent = true;
          return all;
        },
        next: async () => {
          if (sent) return null;
          sent = true;
          return all;
        },
      };
    },
  };
}

describe('files under the data folder are private', () => {
  it('a checkpoint save makes its file 0600 and every folder it makes (data, session, parts) 0700', async () => {
    const dir = join(root, 'made', 'checkpoints'); // nothing exists yet: the save makes it all
    const store = checkpointStore({ dir });
    const { bytes, source } = await upload();
    const own = await store.save(store.folder('sess'), bytes.length, source);
    const part = await store.save(store.folder('sess', 'ps-0'), bytes.length, source);
    const files = [join(dir, 'sess', `${own.name}.ckpt`), join(dir, 'sess', 'parts', 'ps-0', `${part.name}.ckpt`)];
    for (const f of files) expect(octal(await modeOf(f)), f).toBe('600');
    for (const d of [join(root, 'made'), dir, join(dir, 'sess'), join(dir, 'sess', 'parts'), join(dir, 'sess', 'parts', 'ps-0')])
      expect(octal(await modeOf(d)), d).toBe('700');
  });

  it('closes a session folder an older version left open (0755) at the next save; leaves the data folder the host made as it is', async () => {
    const dir = join(root, 'older');
    await mkdir(join(dir, 'sess'), { recursive: true });
    await chmod(dir, 0o755);
    await chmod(join(dir, 'sess'), 0o755);
    const store = checkpointStore({ dir });
    const { bytes, source } = await upload();
    await store.save(store.folder('sess'), bytes.length, source);
    expect(octal(await modeOf(join(dir, 'sess')))).toBe('700');
    expect(octal(await modeOf(dir))).toBe('755');
  });

  it('token and host hashes are written 0600 in a 0700 session folder', async () => {
    const dir = join(root, 'tokens');
    const tokens = new SessionTokens(dir);
    await tokens.create('s', tokenFor('s'), tokenFor('s-host'));
    await tokens.persist('s');
    expect((await readdir(join(dir, 's'))).sort()).toEqual([HOST_FILE, TOKEN_FILE].sort());
    for (const f of [TOKEN_FILE, HOST_FILE]) expect(octal(await modeOf(join(dir, 's', f))), f).toBe('600');
    for (const d of [dir, join(dir, 's')]) expect(octal(await modeOf(d)), d).toBe('700');
  });
});
