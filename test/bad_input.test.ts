/**
 * Bad input against the real server: every malformed frame gets an error reply (or, for abuse,
 * a close with a reason); the server keeps serving everyone else; sessions stay isolated.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { RunningServer } from '../signaling/server.ts';
import { StoreError } from '../src/wire/errors.ts';
import { PROTOCOL_VERSION, encodeValue } from '../src/wire/protocol.ts';
import { connect, text, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';
import { StoreTimeoutError } from '../src/wire/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer({
    limits: { maxFrameBytes: 64 * 1024, maxKeysPerSession: 20, maxBytesPerSession: 4096, maxErrorsPerSocket: 5 },
  });
});
afterAll(async () => {
  await server.close();
});

/** A raw socket, to send what no well-behaved client would. */
class Raw {
  readonly messages: Array<Record<string, unknown>> = [];
  closed: Promise<{ code: number; reason: string }>;
  private waiters: Array<() => void> = [];
  constructor(readonly ws: WebSocket) {
    ws.on('message', (d) => {
      this.messages.push(JSON.parse(d.toString()) as Record<string, unknown>);
      for (const w of this.waiters.splice(0)) w();
    });
    this.closed = new Promise((resolve) => ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() })));
  }
  static async open(): Promise<Raw> {
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}ws`);
    await new Promise((r, j) => {
      ws.once('open', r);
      ws.once('error', j);
    });
    return new Raw(ws);
  }
  async send(frame: string | object): Promise<Record<string, unknown>> {
    const before = this.messages.length;
    this.ws.send(typeof frame === 'string' ? frame : JSON.stringify(frame));
    while (this.messages.length === before) await new Promise<void>((r) => this.waiters.push(r));
    return this.messages[before];
  }
}

describe('bad input', () => {
  it('answers malformed JSON, unknown types and wrong field types with error replies', async () => {
    const raw = await Raw.open();
    expect(await raw.send('{not json')).toMatchObject({ type: 'error', code: 'BAD_JSON' });
    expect(await raw.send('[1,2]')).toMatchObject({ type: 'error', code: 'BAD_MESSAGE' });
    expect(await raw.send({ type: 'set', key: 'k', value: '' })).toMatchObject({
      code: 'BAD_MESSAGE',
      message: expect.stringContaining('"id"'),
    });
    expect(await raw.send({ type: 'frobnicate', id: 1 })).toMatchObject({ id: 1, code: 'UNKNOWN_TYPE' });
    raw.ws.close();
  });

  it('refuses store calls before hello, and bad session names', async () => {
    const raw = await Raw.open();
    expect(await raw.send({ type: 'get', id: 1, key: 'k', timeoutMs: 10 })).toMatchObject({ id: 1, code: 'NO_SESSION' });
    expect(await raw.send({ type: 'hello', id: 2, session: 'no spaces!', version: PROTOCOL_VERSION, token: tokenFor('x') })).toMatchObject({
      id: 2,
      code: 'BAD_SESSION',
    });
    expect(await raw.send({ type: 'hello', id: 3, session: 'ok', version: 99, token: tokenFor('ok') })).toMatchObject({
      id: 3,
      code: 'BAD_VERSION',
    });
    const first = uniqueSession();
    expect(await raw.send({ type: 'hello', id: 4, session: first, version: PROTOCOL_VERSION, token: tokenFor(first) })).toMatchObject({
      id: 4,
      type: 'reply',
    });
    expect(await raw.send({ type: 'hello', id: 5, session: 'other', version: PROTOCOL_VERSION, token: tokenFor('other') })).toMatchObject({
      id: 5,
      code: 'ALREADY_IN_SESSION',
    });
    raw.ws.close();
  });

  it('names the field that has the wrong type', async () => {
    const cases: Array<[object, string]> = [
      [{ type: 'set', id: 2, key: 5, value: '' }, 'field "key" must be a string'],
      [{ type: 'set', id: 3, key: 'k', value: 'not base64!' }, 'field "value" must be base64'],
      [{ type: 'get', id: 4, key: 'k', timeoutMs: 'soon' }, 'field "timeoutMs" must be an integer'],
      [{ type: 'get', id: 5, key: 'k', timeoutMs: -1 }, 'field "timeoutMs" is -1'],
      [{ type: 'add', id: 6, key: 'k', amount: 1.5 }, 'field "amount" must be an integer'],
      [{ type: 'wait', id: 7, keys: 'k', timeoutMs: 1 }, 'field "keys" must be an array'],
      [{ type: 'multiSet', id: 8, keys: ['a', 'b'], values: [''] }, 'multiSet has 2 keys but 1 values'],
      [{ type: 'rendezvous', id: 9, min: 0, max: 2 }, 'field "min" is 0'],
      [{ type: 'signal', id: 10, to: 1, data: 'x' }, 'field "data" must be an object'],
      [{ type: 'set', id: 11, key: '', value: '' }, 'must not be empty'],
      [{ type: 'rendezvous', id: 12, min: 3, max: 2 }, 'field "max" (2) must be at least "min" (3)'],
      [{ type: 'regroup', id: 13, fromRound: 'one' }, 'field "fromRound" must be an integer'],
      [{ type: 'rendezvous', id: 14, min: 2, max: 4, rank: 1 }, 'field "rank" can only be given for a fixed world size'],
      [{ type: 'regroup', id: 15, fromRound: 1, failed: 'yes' }, 'field "failed" must be true or false'],
    ];
    // A socket per case: this server closes a socket after 5 bad messages.
    for (const [frame, message] of cases) {
      const raw = await Raw.open();
      await raw.send({ type: 'hello', id: 1, session: uniqueSession(), version: PROTOCOL_VERSION, token: tokenFor('fresh') });
      const reply = await raw.send(frame);
      expect(reply).toMatchObject({ type: 'error', code: 'BAD_MESSAGE' });
      expect(reply.message).toContain(message);
      raw.ws.close();
    }
  });

  it('refuses regroup and signal from a socket that has not joined', async () => {
    const raw = await Raw.open();
    await raw.send({ type: 'hello', id: 1, session: uniqueSession(), version: PROTOCOL_VERSION, token: tokenFor('fresh') });
    expect(await raw.send({ type: 'regroup', id: 2, fromRound: 1 })).toMatchObject({ id: 2, code: 'NOT_JOINED' });
    expect(await raw.send({ type: 'signal', id: 3, to: 0, data: { channel: 'x', body: null } })).toMatchObject({
      id: 3,
      code: 'NOT_JOINED',
    });
    raw.ws.close();
  });

  it('closes a socket that sends a frame over the size limit, and keeps serving others', async () => {
    const session = uniqueSession('big');
    const good = await connect(server, session);
    await good.set('kept', 'yes');
    const raw = await Raw.open();
    raw.ws.send('x'.repeat(100 * 1024));
    const closed = await raw.closed;
    expect(closed.code).toBe(1009);
    expect(text(await good.get('kept'))).toBe('yes');
    good.close();
  });

  it('closes a socket that keeps sending garbage, with a reason', async () => {
    const raw = await Raw.open();
    for (let i = 0; i < 7; i++) raw.ws.send('garbage');
    const closed = await raw.closed;
    expect(closed.code).toBe(4001);
    expect(closed.reason).toContain('bad messages');
  });

  it('refuses writes past the session key and byte quotas, all or nothing', async () => {
    const session = uniqueSession('quota');
    const s = await connect(server, session);
    for (let i = 0; i < 20; i++) await s.set(`k${i}`, 'v');
    const err = (await s.set('one-too-many', 'v').catch((e: unknown) => e)) as StoreError;
    expect(err).toBeInstanceOf(StoreError);
    expect(err.code).toBe('QUOTA_KEYS');
    expect(err.message).toContain('limit is 20');
    await s.set('k0', 'overwrite is fine');
    const big = (await s.set('k1', 'x'.repeat(5000)).catch((e: unknown) => e)) as StoreError;
    expect(big.code).toBe('QUOTA_BYTES');
    expect(text(await s.get('k1'))).toBe('v');
    const batch = (await s.multiSet(['k2', 'k3'], ['ok', 'y'.repeat(5000)]).catch((e: unknown) => e)) as StoreError;
    expect(batch.code).toBe('QUOTA_BYTES');
    expect(text(await s.get('k2'))).toBe('v');
    s.close();
  });

  it('isolates sessions: same key names, different values; deletes do not cross', async () => {
    const a = await connect(server, uniqueSession('iso-a'));
    const b = await connect(server, uniqueSession('iso-b'));
    await a.set('shared-name', 'from a');
    expect(await b.check(['shared-name'])).toBe(false);
    await b.set('shared-name', 'from b');
    expect(text(await a.get('shared-name'))).toBe('from a');
    expect(await b.deleteKey('shared-name')).toBe(true);
    expect(text(await a.get('shared-name'))).toBe('from a');
    expect(await a.numKeys()).toBe(1);
    await expect(b.get('shared-name', 100)).rejects.toThrow(errorOf(StoreTimeoutError, /timed out/, { code: 'TIMEOUT' }));
    a.close();
    b.close();
  });

  it('keeps serving a good client while another sends bad input in the same session', async () => {
    const session = uniqueSession('mixed');
    const good = await connect(server, session);
    const raw = await Raw.open();
    await raw.send({ type: 'hello', id: 1, session, version: PROTOCOL_VERSION, token: tokenFor(session) });
    await raw.send({ type: 'set', id: 2, key: 'x', value: encodeValue('raw') });
    await raw.send({ type: 'add', id: 3, key: 'x', amount: 1 });
    expect(await good.add('counter', 1)).toBe(1);
    expect(text(await good.get('x'))).toBe('raw');
    raw.ws.close();
    good.close();
  });
});
