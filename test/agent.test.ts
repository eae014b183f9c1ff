/**
 * The elastic agent (src/elastic/agent.ts), the one round loop of every strategy, with scripted
 * strategies against the real server: a round that fails with every member still here forms a
 * new round of the same members (the agent asks for it: without that ask, the ranks would wait
 * for a round that never forms); a failure no round can help ends the run; the end closes the
 * rendezvous. Each strategy's own failed round runs in its tests (elastic_runner, ps_runner,
 * pipeline), through this loop.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { REGROUP, runAgent } from '../src/elastic/agent.ts';
import { DistTimeoutError, RendezvousClosedError } from '../src/wire/errors.ts';
import { RendezvousHandler } from '../src/c10d/rendezvous.ts';
import { connect, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer({ settleMs: 200 });
});
afterAll(async () => {
  await server.close();
});

async function handlers(session: string, n: number): Promise<RendezvousHandler[]> {
  const net = new MemoryNetwork();
  return Promise.all(
    Array.from({ length: n }, (_, id) =>
      RendezvousHandler.start({
        url: server.url,
        session,
        token: tokenFor(session),
        min: n,
        max: n,
        timeoutMs: 5_000,
        heartbeatIntervalMs: 100,
        reconnect: true,
        failedRoundGraceMs: 300,
        linkFactory: net.factoryFor(id),
      }),
    ),
  );
}

describe('runAgent', () => {
  it('a round that fails on every rank with nobody gone: the strategy reports it, and a new round of the same members runs', async () => {
    const session = uniqueSession('agentfail');
    const hs = await handlers(session, 2);
    const runs = await Promise.all(
      hs.map(async (h) => {
        const rounds: number[] = [];
        const failures: string[] = [];
        const result = await runAgent(h, {
          async round(round) {
            rounds.push(round.round);
            await round.pg.barrier();
            if (rounds.length === 1) throw new DistTimeoutError('an injected link failure', 1);
            return { rank: round.pg.rank, worldSize: round.pg.worldSize };
          },
          async failed(_round, err) {
            failures.push(err instanceof Error ? err.message : String(err));
            return 'retry';
          },
        });
        return { result, rounds, failures };
      }),
    );
    for (const r of runs) {
      expect(r.failures).toHaveLength(1);
      expect(r.rounds).toHaveLength(2);
      expect(r.rounds[1]).toBeGreaterThan(r.rounds[0]!);
      expect(r.result.worldSize).toBe(2);
    }
    expect(runs.map((r) => r.result.rank).sort()).toEqual([0, 1]);
    // The end of the run closed the rendezvous: a tab arriving now is told at once.
    const late = await connect(server, session);
    await expect(late.rendezvous({ min: 2, max: 2 })).rejects.toBeInstanceOf(RendezvousClosedError);
    late.close();
    for (const h of hs) h.shutdown();
  }, 30_000);

  it('a failure the strategy cannot help ends the run with that error; REGROUP with nobody waiting runs the same round again', async () => {
    const session = uniqueSession('agentfatal');
    const hs = await handlers(session, 2);
    const outcomes = await Promise.allSettled(
      hs.map(async (h) => {
        const calls: boolean[] = [];
        await runAgent(h, {
          async round(round, again) {
            calls.push(again);
            await round.pg.barrier();
            if (calls.length === 1) return REGROUP;
            throw new TypeError(`a bug in the step (round ${round.round}, again ${again})`);
          },
          async failed(_round, err) {
            throw err;
          },
        }).catch((err: unknown) => {
          throw Object.assign(err as Error, { calls });
        });
      }),
    );
    for (const o of outcomes) {
      expect(o.status).toBe('rejected');
      const err = (o as PromiseRejectedResult).reason as TypeError & { calls: boolean[] };
      expect(err).toBeInstanceOf(TypeError);
      expect(err.calls).toEqual([false, true]);
    }
    for (const h of hs) h.shutdown();
  }, 30_000);
});
