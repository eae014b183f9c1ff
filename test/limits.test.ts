/**
 * The server's global limits against the real server over real WebSockets, each with small
 * values: every limit refuses with its code (or closes with its close code) and the server keeps
 * serving another client, in the same session and in another one. Also the store's get/delete
 * race, duplicate keys, and who may regroup how often.
 */
import type { Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { RunningServer, ServerOptions } from '../signaling/server.ts';
import { ConnectionClosedError, StoreError } from '../src/wire/errors.ts';
import { PROTOCOL_VERSION, type RoundEvent } from '../src/wire/protocol.ts';
import type { StoreClient } from '../src/c10d/store.ts';
import { connect, pendingWaiters, text, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { Heard, sleep, waitFor } from './fixtures/wait.ts';

let server: RunningServer | undefined;
/**
 * Every wait's bound: far past what any load makes of these waits (the test's own limit is 20 s);
 * it only names the wait that failed, it is never what a test checks.
 */
const BOUND_MS = 15_000;
/** Rounds, peer-left events, raw messages and log lines as they arrive: the waits below wake on them. */
const heard = new Heard(BOUND_MS);
const open: Array<{ close(): void }> = [];
let logged: string[] = [];
afterEach(async () => {
  for (const c of open.splice(0)) c.close();
  await server?.close();
  server = undefined;
});

async function start(options: ServerOptions): Promise<RunningServer> {
  logged = [];
  server = await withServer({
    log: (line) => {
      logged.push(line);
      heard.changed();
    },
    ...options,
  });
  return server;
}

async function client(session: string): Promise<StoreClient> {
  const c = await connect(server!, session);
  open.push(c);
  return c;
}

/** The refusal a call ends with (fails the test if it succeeds). */
async function refusal(p: Promise<unknown>): Promise<StoreError> {
  const err = await p.then(
    () => new Error('expected a refusal'),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(StoreError);
  return err as StoreError;
}

/** Both a client of `session` and one of a fresh session still get answers. */
async function stillServes(session: string): Promise<void> {
  const same = await client(session);
  await same.set('alive', 'yes');
  expect(text(await same.get('alive', 1_000))).toBe('yes');
  const other = await client(uniqueSession('other'));
  expect(await other.add('n', 1)).toBe(1);
}

/** Waits for a condition over what the test heard (see `heard`): checked again as each event arrives. */
const until = (ok: () => boolean, what: string): Promise<void> => heard.until(what, ok);
/** The server's own state says nothing when it changes: polled, within the same bound. */
const untilServer = (ok: () => boolean, what: string): Promise<void> => waitFor(what, ok, { timeoutMs: BOUND_MS });

/** A raw socket, for clients that misbehave below the StoreClient. */
class Raw {
  readonly messages: Array<Record<string, unknown>> = [];
  readonly closed: Promise<{ code: number; reason: string }>;
  constructor(readonly ws: WebSocket) {
    ws.on('message', (d) => {
      this.messages.push(JSON.parse(d.toString()) as Record<string, unknown>);
      heard.changed();
    });
    ws.on('error', () => {});
    this.closed = new Promise((resolve) => ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() })));
    open.push({ close: () => ws.terminate() });
  }
  static async open(options: { autoPong?: boolean } = {}): Promise<Raw> {
    const ws = new WebSocket(`${server!.url.replace('http', 'ws')}ws`, options);
    await new Promise((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    });
    return new Raw(ws);
  }
  send(frame: object): void {
    this.ws.send(JSON.stringify(frame));
  }
  async hello(session: string): Promise<void> {
    this.send({ type: 'hello', id: 1, session, version: PROTOCOL_VERSION, token: tokenFor(session) });
    await until(() => this.messages.some((m) => m.id === 1), 'hello');
    expect(this.messages.find((m) => m.id === 1)).toMatchObject({ type: 'reply' });
  }
  /** `ws` keeps its TCP socket private; pausing it is a peer that stops reading (a stuck tab). */
  pauseReading(): Socket {
    const socket = (this.ws as unknown as { _socket: Socket })._socket;
    socket.pause();
    return socket;
  }
}

/** Resolves within `ms` or fails saying what it waited for. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([
    p,
    new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms)),
  ]);
}

describe('store correctness', () => {
  it('a get woken by a set returns that value even when a delete comes right behind it', async () => {
    await start({});
    const session = uniqueSession('race');
    const [a, b] = [await client(session), await client(session)];
    const pending = a.get('k', BOUND_MS);
    const many = a.multiGet(['x', 'y'], BOUND_MS);
    await untilServer(() => pendingWaiters(server!, session) === 2, 'the get and the multiGet to wait on the server');
    // Sent back to back: the server reads them in one go, before the waiting get resumes.
    const writes = [b.set('k', 'v'), b.deleteKey('k'), b.multiSet(['x', 'y'], ['1', '2']), b.deleteKey('x')];
    expect(text(await pending)).toBe('v');
    expect((await many).map(text)).toEqual(['1', '2']);
    expect(await Promise.all(writes)).toEqual([undefined, true, undefined, true]);
    // A key present when the get arrives, deleted by the next frame: the same.
    await b.set('now', 'here');
    const [value, deleted] = await Promise.all([a.get('now', 1_000), a.deleteKey('now')]);
    expect([text(value), deleted]).toEqual(['here', true]);
    expect(logged.filter((l) => l.includes('unexpected'))).toEqual([]);
  });

  it('refuses a request that names a key twice (wait, check, multiGet, multiSet)', async () => {
    await start({});
    const session = uniqueSession('dup');
    const s = await client(session);
    for (const call of [
      s.multiGet(['a', 'b', 'a'], 100),
      s.wait(['a', 'a'], 100),
      s.check(['a', 'a']),
      s.multiSet(['a', 'a'], ['1', '2']),
    ]) {
      const err = await refusal(call);
      expect(err.code).toBe('DUPLICATE_KEYS');
      expect(err.message).toContain('names key "a" twice');
    }
    expect(await s.check(['a'])).toBe(false);
    await stillServes(session);
  });
});

describe('limits', () => {
  it('maxReplyBytes: get and multiGet whose reply would be too large are refused before it is built', async () => {
    await start({ limits: { maxReplyBytes: 10_000 } });
    const session = uniqueSession('reply');
    const s = await client(session);
    await s.multiSet(['a', 'b'], ['x'.repeat(6_000), 'y'.repeat(6_000)]);
    expect((await s.get('a')).length).toBe(6_000);
    const many = await refusal(s.multiGet(['a', 'b']));
    expect(many.code).toBe('REPLY_TOO_LARGE');
    expect(many.message).toMatch(/the reply would be \d+ bytes \(the 2 values, as base64\); the limit is 10000\. Ask for fewer keys/);
    await s.append('a', 'z'.repeat(2_000));
    expect((await refusal(s.get('a'))).code).toBe('REPLY_TOO_LARGE');
    // A blocking multiGet is checked when its keys arrive.
    const later = s.multiGet(['b', 'c'], 1_000);
    await s.set('c', 'w'.repeat(6_000));
    expect((await refusal(later)).code).toBe('REPLY_TOO_LARGE');
    await stillServes(session);
  });

  it('maxServerBytes: all sessions share one budget; deleting or dropping a session gives bytes back', async () => {
    await start({ limits: { maxServerBytes: 10_000 }, sessionIdleMs: 100 });
    const [one, two] = [uniqueSession('full-a'), uniqueSession('full-b')];
    const a = await client(one);
    const b = await client(two);
    await a.set('big', 'x'.repeat(6_000));
    const err = await refusal(b.set('big', 'y'.repeat(6_000)));
    expect(err.code).toBe('QUOTA_SERVER_BYTES');
    expect(err.message).toContain('the limit is 10000');
    expect(await b.add('small', 1)).toBe(1); // what fits still goes in
    await a.deleteKey('big');
    await b.set('big', 'y'.repeat(6_000));
    await b.deleteKey('big');
    await a.set('big', 'x'.repeat(6_000));
    // Session one goes idle and is dropped with its keys: its bytes are free again.
    a.close();
    await untilServer(() => !server!.sessions.has(one), 'the idle session to be dropped');
    await b.set('big', 'y'.repeat(6_000));
    await stillServes(two);
  });

  it('maxSessions: a hello naming a new session is refused while the server is full; a dropped session frees its place', async () => {
    await start({ limits: { maxSessions: 2 }, sessionIdleMs: 200 });
    const [one, two, three] = [uniqueSession('s1'), uniqueSession('s2'), uniqueSession('s3')];
    const a = await client(one);
    const b = await client(two);
    await b.set('kept', '1');
    const err = (await connect(server!, three).catch((e: unknown) => e)) as StoreError;
    expect(err).toBeInstanceOf(StoreError);
    expect(err.code).toBe('TOO_MANY_SESSIONS');
    expect(err.message).toContain('maximum of 2 sessions');
    // Existing sessions go on: a second client of one, and of two.
    const a2 = await client(one);
    expect(await a2.add('n', 1)).toBe(1);
    expect(text(await (await client(two)).get('kept'))).toBe('1');
    // Session one's sockets close: the sweeper drops it, keys and all, and its place is free.
    a.close();
    a2.close();
    await untilServer(() => !server!.sessions.has(one), 'the idle session to be dropped');
    const c = await client(three);
    await c.set('x', '1');
    expect(text(await (await client(two)).get('kept'))).toBe('1');
  });

  it('maxPendingPerSocket: blocking calls past the limit are refused; calls that need not wait are not', async () => {
    await start({ limits: { maxPendingPerSocket: 3 } });
    const session = uniqueSession('pending');
    const s = await client(session);
    const waits = [s.get('p1', BOUND_MS), s.wait(['p2'], BOUND_MS), s.multiGet(['p3'], BOUND_MS)];
    const err = await refusal(s.get('p4', BOUND_MS));
    expect(err.code).toBe('TOO_MANY_PENDING');
    expect(err.message).toContain('the limit is 3');
    await s.set('here', '1');
    expect(text(await s.get('here'))).toBe('1'); // present: it does not wait
    await s.multiSet(['p1', 'p2', 'p3'], ['1', '2', '3']);
    await Promise.all(waits);
    expect(text(await s.get('here', 100))).toBe('1');
    const again = s.get('p4', BOUND_MS);
    await s.set('p4', '4');
    expect(text(await again)).toBe('4');
    await stillServes(session);
  });

  it('maxConnectionsPerAddress: the extra socket is closed with 4007 and a reason; a place frees when one closes', async () => {
    await start({ limits: { maxConnectionsPerAddress: 2 } });
    const session = uniqueSession('addr');
    const a = await client(session);
    await client(session);
    const err = (await connect(server!, session).catch((e: unknown) => e)) as ConnectionClosedError;
    expect(err).toBeInstanceOf(ConnectionClosedError);
    expect(err.closeCode).toBe(4007);
    expect(err.reason).toContain('2 sockets from your address are open');
    a.close();
    // The server counts the socket free once it saw the close.
    let c: StoreClient | undefined;
    await waitFor(
      "a connection to be let in once the server saw a's close",
      async () => {
        c = await connect(server!, session).catch(() => undefined);
        return c !== undefined;
      },
      { timeoutMs: BOUND_MS, intervalMs: 20 },
    );
    open.push(c!);
    expect(await c!.add('n', 1)).toBe(1);
  });

  it('helloTimeoutMs: a socket that says nothing is closed with 4004; one that said hello stays', async () => {
    await start({ limits: { helloTimeoutMs: 200 } });
    const session = uniqueSession('hello');
    const good = await client(session);
    const silent = await Raw.open();
    const t0 = Date.now();
    expect(await within(silent.closed, BOUND_MS, 'the silent socket to close')).toEqual({ code: 4004, reason: 'no hello within 200 ms' });
    expect(Date.now() - t0).toBeLessThan(1_000);
    // Checks that something did not happen (good closed by a hello timer), so it can only wait: good
    // opened first, so its timer would have fired before silent's; 100 ms more lets that close arrive.
    await sleep(100);
    expect(await good.add('n', 1)).toBe(1);
    await stillServes(session);
  });

  it('pingIntervalMs: a socket that does not answer pings is cut off (and leaves the group); one that does stays', async () => {
    // No heartbeat eviction in this test: only the pings can notice the dead peer.
    // The first round forms when both members are there (max), never on a clock: a settle time
    // short enough for the test lost the race with a loaded machine, forming a round of one.
    await start({ limits: { pingIntervalMs: 100 }, heartbeatTimeoutMs: 60_000, settleMs: 60_000 });
    const session = uniqueSession('ping');
    const good = await client(session);
    const rounds: RoundEvent[] = [];
    good.on('round', (e) => {
      rounds.push(e);
      heard.changed();
    });
    await good.rendezvous({ min: 1, max: 2 });
    // `autoPong: false`: the socket reads everything but never answers a ping, like a dead peer's.
    const dead = await Raw.open({ autoPong: false });
    // Hello and rendezvous back to back: the server reads both before its next ping check.
    const said = dead.hello(session);
    dead.send({ type: 'rendezvous', id: 2, min: 1, max: 2 });
    await said;
    await until(() => rounds.some((r) => r.worldSize === 2), 'a round with both members');
    const closed = await within(dead.closed, BOUND_MS, 'the dead socket to be cut off');
    expect(closed.code).toBe(1006); // terminated: no close handshake with a dead peer
    await until(() => rounds.at(-1)!.worldSize === 1, 'a round without the dead member');
    expect(logged.some((l) => l.includes('did not answer a ping'))).toBe(true);
    expect(good.isClosed).toBe(false);
    await stillServes(session);
  });

  it('maxBufferedBytes: a client that does not read its replies is cut off instead of filling memory', async () => {
    await start({ limits: { maxBufferedBytes: 256 * 1024 } });
    const session = uniqueSession('slow');
    const keys = ['v0', 'v1', 'v2', 'v3'];
    const writer = await client(session);
    await writer.multiSet(
      keys,
      keys.map((k) => k.repeat(50_000)),
    );
    const slow = await Raw.open();
    await slow.hello(session);
    const socket = slow.pauseReading();
    // ~530 KB per reply; the kernel's buffers take a few MB before anything waits in the server.
    let sent = 0;
    for (; sent < 200 && !logged.some((l) => l.includes('not reading')); sent++) {
      slow.send({ type: 'multiGet', id: 10 + sent, keys, timeoutMs: 100 });
      await sleep(2); // paced, so the cut-off can come while it is still asking (the behaviour under test)
    }
    await until(() => logged.some((l) => l.includes('not reading: over 262144 bytes waiting to be sent')), 'the slow reader to be cut off');
    socket.resume();
    await within(slow.closed, BOUND_MS, 'the slow reader to close');
    expect(sent).toBeLessThan(200); // cut off while it was still asking, not after the server queued everything
    await stillServes(session);
  });

  it('maxErrorsPerSocket: refusals of the abuse kinds count; timeouts do not', async () => {
    await start({ limits: { maxErrorsPerSocket: 3, maxReplyBytes: 1_000 } });
    const session = uniqueSession('errors');
    const s = await client(session);
    for (let i = 0; i < 5; i++) expect((await refusal(s.get('never', 1))).code).toBe('TIMEOUT');
    await s.set('big', 'x'.repeat(2_000));
    const closed = new Promise<{ code: number; reason: string }>((resolve) => s.on('close', resolve));
    for (let i = 0; i < 4; i++) expect((await refusal(s.get('big'))).code).toBe('REPLY_TOO_LARGE');
    expect(await within(closed, BOUND_MS, 'the close')).toEqual({ code: 4001, reason: 'more than 3 bad messages' });
    // The log has the first refusal of each kind and a count of the rest, not one line each.
    await server!.close();
    server = undefined;
    expect(logged.filter((l) => l.includes('REPLY_TOO_LARGE')).length).toBe(2);
    expect(logged.some((l) => /3 more of: refused REPLY_TOO_LARGE/.test(l))).toBe(true);
  });
});

describe('regroup', () => {
  /** A member of `session`'s group; its rounds as they come. */
  async function member(session: string): Promise<{ s: StoreClient; rounds: RoundEvent[] }> {
    const s = await client(session);
    const rounds: RoundEvent[] = [];
    s.on('round', (e) => {
      rounds.push(e);
      heard.changed();
    });
    await s.rendezvous({ min: 1, max: 4 }, 100);
    return { s, rounds };
  }

  it('only a member with a rank in the running round may ask; a member asking about an older round just learns the latest', async () => {
    await start({ settleMs: 50 });
    const session = uniqueSession('gate');
    const a = await member(session);
    await until(() => a.rounds.length === 1, 'round 1');
    const b = await member(session);
    const err = await refusal(b.s.regroup(1));
    expect(err.code).toBe('NOT_JOINED');
    expect(err.message).toContain('is waiting to be admitted');
    const outsider = await client(session);
    expect((await refusal(outsider.regroup(1))).code).toBe('NOT_JOINED');
    expect((await a.s.regroup(1)).round).toBe(2);
    await until(() => b.rounds.length === 1, "b's round");
    expect(b.rounds[0]).toMatchObject({ round: 2, rank: 1, worldSize: 2 });
    expect((await b.s.regroup(1)).round).toBe(2); // stale: answered, nothing formed
    expect((await b.s.regroup(2)).round).toBe(2); // nobody waits: nothing to do
    await stillServes(session);
  });

  it('forms at most one round per regroupIntervalMs: a regroup asked for sooner is answered when the interval ends', async () => {
    await start({ settleMs: 50, limits: { regroupIntervalMs: 400 } });
    const session = uniqueSession('rate');
    const a = await member(session);
    await until(() => a.rounds.length === 1, 'round 1');
    const b = await member(session);
    // Timed from before the regroup that forms round 2 and starts the interval: a lower bound that
    // a slow machine cannot break (timed from its reply, the reply's own delay came off the bound).
    const t0 = Date.now();
    expect((await a.s.regroup(1)).round).toBe(2);
    const c = await member(session);
    // Every rank asks, as the runner does after its barrier; both get the round formed at the end of the interval.
    const answers = await within(Promise.all([a.s.regroup(2), b.s.regroup(2)]), BOUND_MS, 'the deferred regroup');
    const waited = Date.now() - t0;
    expect(answers.map((r) => r.round)).toEqual([3, 3]);
    expect(waited).toBeGreaterThanOrEqual(390); // 400, less the clocks' millisecond rounding
    expect(waited).toBeLessThan(1_500);
    await until(() => c.rounds.length === 1, "c's round");
    expect(c.rounds[0]).toMatchObject({ round: 3, rank: 2, worldSize: 3 });
    // Asking again and again forms nothing more while nobody waits.
    const more = await Promise.all(Array.from({ length: 20 }, () => a.s.regroup(3)));
    expect(new Set(more.map((r) => r.round))).toEqual(new Set([3]));
    expect(a.rounds.map((r) => r.round)).toEqual([1, 2, 3]);
  });

  it('a round that failed with every member still here (failed): the same members start a new round, once, at most one per interval', async () => {
    await start({ settleMs: 50, limits: { regroupIntervalMs: 400 } });
    const session = uniqueSession('failed');
    const a = await member(session);
    await until(() => a.rounds.length === 1, 'round 1');
    const b = await member(session);
    // Timed from before the regroup that starts round 2's interval (see above).
    const t0 = Date.now();
    expect((await a.s.regroup(1)).round).toBe(2);
    // Nobody waits: a plain regroup forms nothing; a failed one forms round 3 of the same ranks.
    expect((await b.s.regroup(2)).round).toBe(2);
    const [fromA, fromB] = await within(Promise.all([a.s.regroup(2, true), b.s.regroup(2, true)]), BOUND_MS, 'the failed round’s regroup');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(390); // inside the interval of round 2's: deferred (400, less rounding)
    expect([fromA.round, fromB.round]).toEqual([3, 3]);
    await until(() => b.rounds.length === 2, "b's round 3");
    expect(a.rounds.at(-1)).toMatchObject({ round: 3, rank: 0, worldSize: 2 });
    expect(b.rounds.at(-1)).toMatchObject({ round: 3, rank: 1, worldSize: 2 });
    // Both ranks reporting round 2's failure formed one round; a report about it now is stale.
    expect((await a.s.regroup(2, true)).round).toBe(3);
    expect(a.rounds.map((r) => r.round)).toEqual([1, 2, 3]);
    expect(logged.some((l) => l.includes('round 3, 2 rank(s) (round 2 failed on rank 0)'))).toBe(true);
    // Only a rank of the running round may say it failed.
    const outsider = await client(session);
    expect((await refusal(outsider.regroup(3, true))).code).toBe('NOT_JOINED');
    await stillServes(session);
  });

  it('one member cannot keep the group regrouping: its failed-round regroups past maxFailedRegroupsPerMember are refused', async () => {
    await start({ settleMs: 50, limits: { regroupIntervalMs: 10, maxFailedRegroupsPerMember: 2 } });
    const session = uniqueSession('regroup-flood');
    const a = await member(session);
    await until(() => a.rounds.length === 1, 'round 1');
    expect((await a.s.regroup(1, true)).round).toBe(2);
    expect((await a.s.regroup(2, true)).round).toBe(3);
    const err = await refusal(a.s.regroup(3, true));
    expect(err.code).toBe('RATE_LIMITED');
    expect(err.message).toContain('asked for 2 regroups after failures in 10 minutes, the most one member may');
    expect(a.rounds.map((r) => r.round)).toEqual([1, 2, 3]);
    await stillServes(session);
  });

  it('losses that come together form one round (lossIntervalMs): each is told at once by its rank in the running round, the last live ranks take the lost places', async () => {
    // The first round forms when all 6 are there (max), not after a settle time they could miss.
    await start({ settleMs: 60_000, limits: { lossIntervalMs: 600 } });
    const session = uniqueSession('losses');
    const members: Array<{ s: StoreClient; rounds: RoundEvent[]; left: number[] }> = [];
    for (let i = 0; i < 6; i++) {
      const s = await client(session);
      const m = { s, rounds: [] as RoundEvent[], left: [] as number[] };
      s.on('round', (e) => {
        m.rounds.push(e);
        heard.changed();
      });
      s.on('peer-left', (e) => {
        m.left.push(e.rank);
        heard.changed();
      });
      await s.rendezvous({ min: 1, max: 6 }, 100);
      members.push(m);
    }
    await until(() => members.every((m) => m.rounds.at(-1)?.worldSize === 6), 'the round of 6');
    const [a, , , , e, f] = members;
    const first = a.rounds.at(-1)!.round;
    const rankOf = (m: (typeof members)[number]) => m.rounds.at(-1)!.rank;
    expect(members.map(rankOf)).toEqual([0, 1, 2, 3, 4, 5]);
    // Ranks 1 and 2 leave together, rank 3 a moment later (past LOSS_GATHER_MS, inside the interval).
    members[1].s.close();
    members[2].s.close();
    await until(() => a.left.length === 2, 'two peer-left events');
    await sleep(250);
    members[3].s.close();
    // Each loss is told at once, by its rank in the round still running: no round formed between.
    await until(() => a.left.length === 3, 'the third peer-left');
    expect(a.rounds.at(-1)!.round).toBe(first);
    expect([...a.left].sort()).toEqual([1, 2, 3]);
    await until(() => a.rounds.at(-1)!.round > first, 'the round after the losses');
    await sleep(300); // no second round follows
    expect(a.rounds.map((r) => r.round)).toEqual([first, first + 1]);
    // Rank 0 keeps its rank; the last live ranks (5, then 4) take the lowest lost places.
    expect([rankOf(a), rankOf(f), rankOf(e)]).toEqual([0, 1, 2]);
    expect(a.rounds.at(-1)!.worldSize).toBe(3);
    expect(logged.some((l) => new RegExp(`round ${first + 1}, 3 rank\\(s\\) \\(rank \\d closed its connection`).test(l))).toBe(true);
    // A loss long after the last round forms its own at once (LOSS_GATHER_MS later).
    await sleep(600);
    const t0 = Date.now();
    e.s.close();
    await until(() => a.rounds.length === 3, 'the round after a lone loss');
    expect(Date.now() - t0).toBeLessThan(600);
    expect(a.rounds.at(-1)).toMatchObject({ round: first + 2, rank: 0, worldSize: 2 });
    await stillServes(session);
  });

  it('a deferred regroup is answered by whatever round comes first (a member leaving)', async () => {
    await start({ settleMs: 50, limits: { regroupIntervalMs: 5_000 } });
    const session = uniqueSession('defer');
    const a = await member(session);
    await until(() => a.rounds.length === 1, 'round 1');
    const b = await member(session);
    expect((await a.s.regroup(1)).round).toBe(2);
    await member(session);
    const deferred = a.s.regroup(2);
    // The server takes a socket's requests in order, and defers a regroup as it reads it: once this
    // reply is back, the regroup waits (b leaving first would make it merely stale, answered 3 too).
    await a.s.check(['nothing']);
    b.s.close();
    // b's loss forms round 3 at once (with the waiting member in it): the deferred answer is 3.
    expect((await within(deferred, BOUND_MS, 'the deferred regroup')).round).toBe(3);
    expect(a.rounds.at(-1)).toMatchObject({ round: 3, worldSize: 2 });
  });
});
