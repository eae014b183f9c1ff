/**
 * Member ids cannot run out (security review, issue 51 finding 7a): a session that has handed out
 * 2^24 ids (a reconnect loop) still admits members, whose ids pass the client's checks and name
 * their links; and one address cannot spin joins into a session (JoinRate).
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { Rendezvous } from '../signaling/rendezvous.ts';
import { JoinRate } from '../signaling/join_rate.ts';
import { ErrorCode, type ServerMessage } from '../src/wire/protocol.ts';
import { parseServerMessage } from '../src/wire/protocol_validation.ts';
import { RendezvousHandler } from '../src/c10d/rendezvous.ts';
import { StoreError } from '../src/wire/errors.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { connect, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';
import { StoreRefusal } from '../signaling/store.ts';

/** Ids the old bound (2^24 - 1) allowed: a session had handed out all but the last. */
const PAST_OLD_BOUND = 2 ** 24 - 1;
const timing = { maxSpectators: 0, settleMs: 0, regroupIntervalMs: 0 };

let server: RunningServer | undefined;
const closers: Array<() => void> = [];
afterEach(async () => {
  for (const close of closers.splice(0)) close();
  await server?.close();
  server = undefined;
});

describe('member ids', () => {
  it("a rendezvous past 2^24 ids admits members, and their round event passes the client's validation", () => {
    for (const first of [PAST_OLD_BOUND, 2 ** 52]) {
      const heard: ServerMessage[] = [];
      const rv = new Rendezvous({ min: 3, max: 3, ...timing }, 's', () => {}, 0, first);
      const ids = [0, 1, 2].map(() => rv.admit({ send: (m) => heard.push(m) }, { min: 3, max: 3 }));
      expect(ids).toEqual([first, first + 1, first + 2]);
      const rounds = heard.filter((m) => m.type === 'round');
      expect(rounds).toHaveLength(3);
      // What each tab receives: the wire text, checked as the client checks it.
      for (const m of rounds) expect(parseServerMessage(JSON.stringify(m))).toMatchObject({ type: 'round', members: ids });
      rv.close();
    }
  });

  it('a session that handed out 2^24 ids still forms rounds whose links work (the ids carry into its next group)', async () => {
    server = await withServer({ settleMs: 50 });
    const session = uniqueSession('ids');
    const creator = await connect(server, session);
    closers.push(() => creator.close());
    // A group that emptied after 2^24 - 2 members (the test hook: set the counter, not 16M joins).
    const s = server.sessions.get(session)!;
    s.rendezvous = new Rendezvous({ min: 2, max: 2, ...timing }, session, () => {}, 0, PAST_OLD_BOUND);
    const net = new MemoryNetwork();
    const channels: string[] = [];
    const agents = await Promise.all(
      [0, 1].map(async (i) => {
        const a = await RendezvousHandler.start({
          url: server!.url,
          session,
          token: tokenFor(session),
          min: 2,
          max: 2,
          timeoutMs: 5_000,
          heartbeatIntervalMs: 100,
          reuseLinks: true,
          linkFactory: (o) => {
            channels.push(o.channel);
            return net.factoryFor(i)(o);
          },
        });
        closers.push(() => a.shutdown());
        return a;
      }),
    );
    const rounds = await Promise.all(agents.map((a) => a.nextRendezvous(0)));
    expect([...rounds[0]!.members].sort()).toEqual([PAST_OLD_BOUND, PAST_OLD_BOUND + 1]);
    // The links between them are named by these ids (the link pool's channels): a barrier crosses them.
    await Promise.all(rounds.map((r) => r.pg.barrier(5_000)));
    const out = await Promise.all(rounds.map((r) => r.pg.allReduce(new Float32Array([r.rank + 1]), 'sum')));
    expect(out.map((o) => [...o])).toEqual([[3], [3]]);
    expect(channels.some((c) => c.endsWith(`:${PAST_OLD_BOUND}-${PAST_OLD_BOUND + 1}`))).toBe(true);
  });
});

describe('join rate', () => {
  it('one address joining one session in a loop is refused RATE_LIMITED past its burst; other sessions are not', async () => {
    server = await withServer({ settleMs: 10_000, joinRate: { burst: 3, perSecond: 0.01 } });
    const session = uniqueSession('loop');
    /** One turn of a reconnect loop: a new socket, a join, and gone. */
    const joinOnce = async (name: string) => {
      const c = await connect(server!, name);
      try {
        return await c.rendezvous({ min: 2, max: 8 });
      } finally {
        c.close();
      }
    };
    for (let i = 0; i < 3; i++) await joinOnce(session);
    const refused = await joinOnce(session).then(
      () => null,
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(StoreError);
    expect((refused as StoreError).code).toBe(ErrorCode.RATE_LIMITED);
    expect((refused as StoreError).message).toMatch(
      /too many joins of session ".*" from .*: 3 at once, then 0\.01 a second; join again in \d+ ms/,
    );
    // Another session's budget is its own.
    expect((await joinOnce(uniqueSession('other'))).memberId).toBe(1);
  });

  it('earns joins back over time, and keeps a bounded number of buckets', () => {
    const rate = new JoinRate({ burst: 2, perSecond: 4 });
    rate.take('a', 's', 0);
    rate.take('a', 's', 0);
    expect(() => rate.take('a', 's', 100)).toThrow(errorOf(StoreRefusal, /join again in 150 ms/, { code: 'RATE_LIMITED' }));
    rate.take('a', 's', 250); // one earned back after 250 ms
    expect(refusal(() => rate.take('a', 's', 250))).toBe(ErrorCode.RATE_LIMITED);
    rate.take('b', 's', 250); // another address has its own
    rate.take('a', 't', 250); // and another session
    for (let i = 0; i < 20_000; i++) rate.take(`x${i}`, 's', 10_000 + i);
    expect(rate.size).toBeLessThanOrEqual(16_384);
  });
});

/** The code of the refusal `f` throws (signaling's StoreRefusal), or null when it does not throw. */
function refusal(f: () => void): unknown {
  try {
    f();
    return null;
  } catch (e) {
    return (e as { code?: unknown }).code;
  }
}
