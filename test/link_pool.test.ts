/** Links kept across rounds (transport/link_pool.ts): on in-memory links, and through the real server's rounds. */
import { afterEach, describe, expect, it } from 'vitest';
import { LinkPool, MAX_AHEAD_BYTES, encodeRoundMarker } from '../src/transport/link_pool.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import type { PeerLink, PendingLink } from '../src/transport/peer_link.ts';
import { RendezvousHandler } from '../src/c10d/rendezvous.ts';
import type { RunningServer } from '../signaling/server.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';
import { PeerLostError } from '../src/wire/errors.ts';

const LINK = { iceServers: [], highWaterMark: 1 << 20, windowBytes: 0, stallTimeoutMs: 5_000 };

function pool(net: MemoryNetwork, self: number): LinkPool {
  return new LinkPool({ self, instance: 'test', base: net.factoryFor(self), sendSignal: async () => {}, link: LINK });
}

/** Round `round`'s view of the link to `peer` (a rank), with what it receives and why it closed. */
function view(p: LinkPool, round: number, peer: number): { pending: PendingLink; got: string[]; closed: string[] } {
  const pending = p.factoryFor(round)({ peer, channel: 'ignored', initiator: false, sendSignal: () => {}, ...LINK });
  const got: string[] = [];
  const closed: string[] = [];
  pending.link.onMessage((b) => got.push(new TextDecoder().decode(b)));
  pending.link.onClose((r) => closed.push(r));
  return { pending, got, closed };
}

const text = (s: string) => new TextEncoder().encode(s);
const settle = () => new Promise((r) => setTimeout(r, 20));

describe('LinkPool', () => {
  it("a new round reuses the open link: each round's messages reach only that round's view, a peer ahead is waited for, and a round over cannot send", async () => {
    const net = new MemoryNetwork();
    const [a, b] = [pool(net, 1), pool(net, 2)];
    a.enterRound(1, [1, 2]);
    b.enterRound(1, [1, 2]);
    const [a1, b1] = [view(a, 1, 1), view(b, 1, 0)];
    await Promise.all([a1.pending.opened, b1.pending.opened]);
    await a1.pending.link.send(text('one'));
    await settle();
    expect(b1.got).toEqual(['one']);

    // A moves on first; B is still in round 1 when A's round-2 message comes.
    a.enterRound(2, [1, 2]);
    const a2 = view(a, 2, 1);
    await a2.pending.link.send(text('two'));
    await settle();
    expect(b1.got).toEqual(['one']);
    await expect(a1.pending.link.send(text('late'))).rejects.toThrow(errorOf(PeerLostError, /round 1 is over/));

    b.enterRound(2, [1, 2]);
    const b2 = view(b, 2, 0);
    await settle();
    expect(b2.got).toEqual(['two']);
    await b2.pending.link.send(text('back'));
    await settle();
    expect(a2.got).toEqual(['back']);
    // One physical link per side, for both rounds.
    expect(net.links).toHaveLength(2);
    // Closing a round's view leaves the link for the next round.
    a1.pending.link.close();
    expect(a.openMembers()).toEqual([2]);
  });

  it('closes the link to a member the next round leaves out, and one that has not opened by then', async () => {
    const net = new MemoryNetwork();
    const [a, b] = [pool(net, 1), pool(net, 2)];
    a.enterRound(1, [1, 2, 3]);
    b.enterRound(1, [1, 2, 3]);
    const [a1] = [view(a, 1, 1), view(b, 1, 0)];
    await a1.pending.opened;
    // Member 3 never opens its end.
    const toThree = view(a, 1, 2);
    a.enterRound(2, [1, 3]);
    await settle();
    expect(a1.closed[0]).toMatch(/member 2 is not in round 2/);
    expect(toThree.closed[0]).toMatch(/had not opened by round 2/);
    expect(a.openMembers()).toEqual([]);
  });

  it('closeBroken (a round failed with every member there) closes only the links that are not open: the open ones serve the next round', async () => {
    const net = new MemoryNetwork();
    const [a, b] = [pool(net, 1), pool(net, 2)];
    a.enterRound(1, [1, 2, 3]);
    b.enterRound(1, [1, 2, 3]);
    const [a1, b1] = [view(a, 1, 1), view(b, 1, 0)];
    await Promise.all([a1.pending.opened, b1.pending.opened]);
    // Member 3 never opens its end: that link is what failed the round.
    const toThree = view(a, 1, 2);
    a.closeBroken('round 1 failed with every member still there');
    await settle();
    expect(toThree.closed[0]).toMatch(/round 1 failed with every member still there/);
    expect(a1.closed).toEqual([]);
    expect(a.openMembers()).toEqual([2]);
    // The next round sends on the link that stayed.
    a.enterRound(2, [1, 2]);
    b.enterRound(2, [1, 2]);
    const [a2, b2] = [view(a, 2, 1), view(b, 2, 0)];
    await a2.pending.link.send(text('still here'));
    await settle();
    expect(b2.got).toEqual(['still here']);
    expect(net.links).toHaveLength(3);
  });

  it('cuts off a peer whose rounds go backwards, and one that sends more than the bound for a round this tab has not reached', async () => {
    const net = new MemoryNetwork();
    const [a, b] = [pool(net, 1), pool(net, 2)];
    for (const p of [a, b]) p.enterRound(1, [1, 2]);
    const [a1, b1] = [view(a, 1, 1), view(b, 1, 0)];
    await Promise.all([a1.pending.opened, b1.pending.opened]);
    const raw = net.end(2, 1) as PeerLink;
    await raw.send(encodeRoundMarker(5));
    await raw.send(encodeRoundMarker(3));
    await settle();
    expect(a1.closed[0]).toMatch(/member 2 went back from round 5 to 3/);

    const [c, d] = [pool(net, 3), pool(net, 4)];
    for (const p of [c, d]) p.enterRound(1, [3, 4]);
    const [c1, d1] = [view(c, 1, 1), view(d, 1, 0)];
    await Promise.all([c1.pending.opened, d1.pending.opened]);
    const fromD = net.end(4, 3) as PeerLink;
    await fromD.send(encodeRoundMarker(9));
    await fromD.send(new Uint8Array(MAX_AHEAD_BYTES + 1));
    await settle();
    expect(c1.closed[0]).toMatch(/member 4 sent over 8388608 bytes for round 9, which this tab has not reached/);
  });
});

describe('LinkPool and signals from a member that names another pair', () => {
  it("a signal naming A's channel, sent by H, neither opens B's link to A nor sends B's answers to H (the sender the server attests is the link's end)", async () => {
    const net = new MemoryNetwork();
    const sent: Array<{ rank: number; channel: string }> = [];
    // Member 2 (B); A is member 1 at rank 0, H member 3 at rank 2. Every link B opens signals at once.
    const base: typeof net.factoryFor extends (id: number) => infer F ? F : never = (o) => {
      const link = net.factoryFor(2)(o);
      o.sendSignal({ type: 'hello' });
      return link;
    };
    const b = new LinkPool({
      self: 2,
      instance: 'test',
      base,
      sendSignal: async (rank, data) => void sent.push({ rank, channel: data.channel }),
      link: LINK,
    });
    b.enterRound(1, [1, 2, 3]);
    const forged = { type: 'signal' as const, from: 2, member: 3, data: { channel: 'link:test:1-2:99', body: { type: 'offer' } } };
    expect(b.onSignal(forged)).toBe(true);
    expect(net.links).toHaveLength(0);
    expect(sent).toEqual([]);
    // A's real offer (attempt 1) is taken, and B answers A's rank, not H's.
    b.onSignal({ type: 'signal', from: 0, member: 1, data: { channel: 'link:test:1-2:1', body: { type: 'offer' } } });
    expect(net.links).toHaveLength(1);
    expect(sent).toEqual([{ rank: 0, channel: 'link:test:1-2:1' }]);
    // H's later attempt at A's channel does not replace the link to A either.
    b.onSignal({ ...forged, data: { channel: 'link:test:1-2:100', body: { type: 'offer' } } });
    expect(net.links).toHaveLength(1);
    expect(sent).toHaveLength(1);
  });
});

describe('rounds over kept links (real server, in-memory links)', () => {
  let server: RunningServer | undefined;
  const handlers: RendezvousHandler[] = [];
  afterEach(async () => {
    for (const h of handlers.splice(0)) h.shutdown();
    await server?.close();
    server = undefined;
  });

  it('after a member leaves, the next round runs its collectives over the links the survivors already had', async () => {
    server = await withServer({ settleMs: 200 });
    const session = uniqueSession('pool');
    const net = new MemoryNetwork();
    for (let i = 0; i < 3; i++) {
      handlers.push(
        await RendezvousHandler.start({
          url: server.url,
          session,
          token: tokenFor(session),
          min: 2,
          max: 3,
          timeoutMs: 10_000,
          heartbeatIntervalMs: 100,
          linkFactory: net.factoryFor(100 + i),
          reuseLinks: true,
        }),
      );
    }
    const r1 = await Promise.all(handlers.map((h) => h.nextRendezvous(0)));
    // An all-gather of 3 (Bruck's: each rank sends to the next two) links every pair.
    const gathered = await Promise.all(r1.map((r) => r.pg.allGather(Float32Array.of(r.rank + 1))));
    expect(gathered.map((g) => [...g])).toEqual([
      [1, 2, 3],
      [1, 2, 3],
      [1, 2, 3],
    ]);
    const opened = net.links.length;
    expect(opened).toBe(6);

    const leaving = r1.findIndex((r) => r.rank === 1);
    handlers[leaving]!.shutdown();
    const stay = handlers.filter((_, i) => i !== leaving);
    const r2 = await Promise.all(stay.map((h) => h.nextRendezvous(r1[handlers.indexOf(h)]!.id)));
    expect(r2.map((r) => r.worldSize)).toEqual([2, 2]);
    const again = await Promise.all(r2.map((r) => r.pg.allReduce(Float32Array.of(10 * (r.rank + 1)), 'sum')));
    expect(again.map((s) => s[0])).toEqual([30, 30]);
    // No link was opened for round 2: the survivors' link carried it.
    expect(net.links.length).toBe(opened);
  });
});
