/**
 * The group's fault history is one record, the server's, and every member holds the same one: a
 * member that arrives late gets it whole as it arrives, and each change reaches every member.
 * Against the real server over real WebSockets (store clients, and runElastic with in-memory
 * links for the steps trained again, which travel with the state).
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { FaultRecord, lossKind } from '../signaling/fault_record.ts';
import { CloseCode, describeMemberClose, MAX_FAULT_ENTRIES, type FaultsEvent, type RoundEvent } from '../src/wire/protocol.ts';
import { parseServerMessage } from '../src/wire/protocol_validation.ts';
import type { StoreClient } from '../src/c10d/store.ts';
import { REMOVED_REASON } from '../signaling/host_remove.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { runElastic, type ElasticRunResult, type StepContext } from '../src/parallel/ddp/runner.ts';
import { MAX_RESUMES, withResume } from '../src/elastic/run_record.ts';
import type { RendezvousEvent } from '../src/c10d/rendezvous.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { buildModel } from '../src/nn/models.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { connect, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';
import { classificationStep } from './fixtures/elastic_step.ts';
import { ServerMessageError } from '../src/wire/errors.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 200, limits: { lossIntervalMs: 0, regroupIntervalMs: 0 } });
});
afterAll(async () => {
  await server.close();
});

/** A member of a session's group over a plain store client: the rounds and the fault records it heard. */
interface Member {
  client: StoreClient;
  rounds: RoundEvent[];
  faults: FaultsEvent[];
  id: number;
}

async function join(session: string): Promise<Member> {
  const client = await connect(server, session);
  const m: Member = { client, rounds: [], faults: [], id: 0 };
  client.on('round', (e) => m.rounds.push(e));
  client.on('faults', (e) => m.faults.push(e));
  // At most 3: the first round forms as the third arrives, however slow the machine.
  m.id = (await client.rendezvous({ min: 2, max: 3 }, 100)).memberId;
  return m;
}

const latestRound = (m: Member) => m.rounds.at(-1)?.round ?? 0;
const record = (m: Member) => m.faults.at(-1);

describe("the group's fault history", () => {
  it('is the same on every member, a late one included: losses by what the server saw, joins after the first round, in order', async () => {
    const session = uniqueSession('faults');
    const [a, b, c] = [await join(session), await join(session), await join(session)];
    await waitFor('the first round of 3', () => [a, b, c].every((m) => m.rounds.at(-1)?.worldSize === 3));
    // Every member got the (empty) record as it arrived.
    for (const m of [a, b, c]) expect(record(m)?.counts).toEqual({ left: 0, froze: 0, removed: 0, failed: 0, joined: 0 });

    // c's tab closes (a page says so with LEFT): lost from round 1, at its rank.
    const cRank = c.rounds.at(-1)!.rank;
    c.client.close(CloseCode.LEFT, 'tab closed');
    await waitFor('the round without c', () => a.rounds.at(-1)?.worldSize === 2 && b.rounds.at(-1)?.worldSize === 2);

    // d arrives while round 2 runs; the running ranks regroup to admit it: it joined mid-run.
    const d = await join(session);
    await a.client.regroup(latestRound(a));
    await waitFor('d admitted', () => (d.rounds.at(-1)?.rank ?? -1) >= 0);
    const joinedRound = latestRound(d);
    const dRank = d.rounds.at(-1)!.rank;

    // b's connection closes without a word (a crashed page): lost, and said so.
    const bRank = b.rounds.at(-1)!.rank;
    const lostRound = latestRound(b);
    b.client.close();
    await waitFor('the round without b', () => a.rounds.at(-1)?.worldSize === 2 && latestRound(a) > lostRound);

    // e arrives after all of it, and holds the whole record at once, before it has a rank.
    const e = await join(session);
    await waitFor('e to hear the record', () => record(e) !== undefined);
    const expected: Omit<FaultsEvent, 'type'> = {
      counts: { left: 1, froze: 0, removed: 0, failed: 1, joined: 1 },
      entries: [
        { kind: 'left', round: 1, rank: cRank, reason: describeMemberClose(CloseCode.LEFT) },
        { kind: 'joined', round: joinedRound, rank: dRank, reason: '' },
        { kind: 'failed', round: lostRound, rank: bRank, reason: describeMemberClose(1000) },
      ],
    };
    expect(record(e)).toEqual({ type: 'faults', ...expected });
    // Admitted by a regroup, e joined too: every member, e itself included, hears the same record.
    await a.client.regroup(latestRound(a));
    await waitFor('e admitted', () => (e.rounds.at(-1)?.rank ?? -1) >= 0);
    const eJoin = { kind: 'joined', round: latestRound(e), rank: e.rounds.at(-1)!.rank, reason: '' };
    await waitFor('every member to hear of e', () => [a, d, e].every((m) => record(m)!.counts.joined === 2));
    for (const m of [a, d, e])
      expect(record(m)).toEqual({ type: 'faults', counts: { ...expected.counts, joined: 2 }, entries: [...expected.entries, eJoin] });
    for (const m of [a, d, e]) m.client.close();
  });

  it("a loss's kind comes from the server's own words for it (a close code, its watchdog, the host's removal)", () => {
    expect(lossKind(describeMemberClose(CloseCode.LEFT))).toBe('left');
    expect(lossKind(describeMemberClose(CloseCode.STALLED))).toBe('froze');
    expect(lossKind('was evicted: nothing received from it for 3100 ms (frozen or hung)')).toBe('froze');
    expect(lossKind(REMOVED_REASON)).toBe('removed');
    for (const code of [1000, 1001, 1006, CloseCode.SLOW_READER, CloseCode.SERVER_CLOSING])
      expect(lossKind(describeMemberClose(code))).toBe('failed');
  });

  it('is bounded: a long run keeps every count but lists only the latest entries; a client refuses a longer list', () => {
    const r = new FaultRecord();
    r.formed(1, [1, 2]);
    for (let i = 0; i < 3 * MAX_FAULT_ENTRIES; i++) {
      r.lost(2 * i + 1, 1, describeMemberClose(CloseCode.LEFT));
      r.formed(2 * i + 2, [1, 100 + i]);
    }
    const e = r.event();
    expect(e.counts).toMatchObject({ left: 3 * MAX_FAULT_ENTRIES, joined: 3 * MAX_FAULT_ENTRIES });
    expect(e.entries).toHaveLength(MAX_FAULT_ENTRIES);
    expect(e.entries.at(-1)).toEqual({ kind: 'joined', round: 6 * MAX_FAULT_ENTRIES, rank: 1, reason: '' });
    expect(JSON.stringify(e).length).toBeLessThan(MAX_FAULT_ENTRIES * 400);
    expect(parseServerMessage(JSON.stringify(e))).toEqual(e);
    expect(() => parseServerMessage(JSON.stringify({ ...e, entries: [...e.entries, e.entries[0]] }))).toThrow(
      errorOf(ServerMessageError, /entries/, { messageType: 'faults' }),
    );
    expect(() => parseServerMessage(JSON.stringify({ ...e, counts: { ...e.counts, froze: -1 } }))).toThrow(
      errorOf(ServerMessageError, /counts/, { messageType: 'faults' }),
    );
  });

  it('the run record carried with the state stays bounded too: the first resume and the latest ones', () => {
    let resumes: string[] = [];
    for (let i = 0; i < 3 * MAX_RESUMES; i++) resumes = withResume(resumes, `resume ${i}`);
    expect(resumes).toHaveLength(MAX_RESUMES);
    expect(resumes[0]).toBe('resume 0');
    expect(resumes.at(-1)).toBe(`resume ${3 * MAX_RESUMES - 1}`);
    expect(resumes[1]).toBe(`resume ${3 * MAX_RESUMES - MAX_RESUMES + 1}`);
  });
});

describe('fault history in an elastic run', () => {
  const data = syntheticDataset({ length: 120, inputSize: 16, numClasses: 4, seed: 1 });
  class TabClosed extends Error {}

  interface RunMember {
    events: ElasticEvent[];
    faults: Array<Extract<RendezvousEvent, { type: 'faults' }>>;
    result: Promise<ElasticRunResult>;
  }

  function member(net: MemoryNetwork, id: number, session: string, extra?: (ctx: StepContext) => Promise<void>): RunMember {
    const events: ElasticEvent[] = [];
    const faults: RunMember['faults'] = [];
    const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 0 });
    const state = new TrainState({ model, optimizer: () => tf.train.sgd(0.1) });
    const result = runElastic({
      url: server.url,
      session,
      token: tokenFor(session),
      min: 2,
      max: 3,
      timeoutMs: 10_000,
      heartbeatIntervalMs: 200,
      linkFactory: net.factoryFor(id),
      state,
      datasetLength: data.length,
      batchSize: 4,
      seed: 5,
      onEvent: (e) => events.push(e),
      onRendezvous: (e) => {
        if (e.type === 'faults') faults.push(e);
      },
      async step(ctx) {
        await extra?.(ctx);
        return classificationStep(ctx, model, data, 4);
      },
    });
    result.catch(() => {});
    return { events, faults, result };
  }

  /** What a tab's dashboard shows of the faults: the server's last record and the latest round's steps trained again. */
  const history = (m: RunMember) => {
    const rounds = m.events.filter((e): e is Extract<ElasticEvent, { type: 'round' }> => e.type === 'round');
    const { counts, entries } = m.faults.at(-1)!;
    return { counts, entries, stepsRedone: rounds.at(-1)?.stepsRedone };
  };

  it('a rank lost mid-step and a rank joining late: every rank that finishes, the late one included, ends with the same history', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('fault-run');
    let joiner: RunMember | undefined;
    const first = [0, 1, 2].map((id) =>
      member(net, id, session, async (ctx) => {
        // Rank 1 closes in step 4 (in flight on every rank: trained again); after the new round, a tab joins.
        if (id === 1 && ctx.step === 4) throw new TabClosed(`closed at step ${ctx.step}`);
        if (id === 0 && ctx.step === 7 && !joiner) joiner = member(net, 3, session);
      }),
    );
    const outcomes = await Promise.allSettled(first.map((m) => m.result));
    expect(outcomes.filter((o) => o.status === 'rejected')).toHaveLength(1);
    const late = await joiner!.result;
    const done = [...outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : [])), late];
    expect(done.map((r) => r.worldSize)).toEqual([3, 3, 3]);
    const finishers = [first[0]!, first[2]!, joiner!];
    const histories = finishers.map(history);
    expect(histories[0]!.counts).toEqual({ left: 0, froze: 0, removed: 0, failed: 1, joined: 1 });
    expect(histories[0]!.entries.map((e) => e.kind)).toEqual(['failed', 'joined']);
    expect(histories[0]!.stepsRedone).toBe(1);
    for (const h of histories) expect(h).toEqual(histories[0]);
    for (const r of done) expect(r.stepsRedone).toBe(1);
    await Promise.all(done.map((r) => r.close()));
  });
});
