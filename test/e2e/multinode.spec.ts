/**
 * Multi-node launch, as torchrun does it: two launchers (two "machines") each open 2 local ranks
 * of one world of 4 against one server (the host's `npm start`). Both succeed only together; one
 * node failing fails the other, with that node's reason.
 */
import { launch, type LaunchOutcome } from '../../launcher/run.ts';
import { tokenFor } from '../fixtures/session.ts';
import { expect, sessionName, test } from './fixtures.ts';

const node = (
  server: string,
  session: string,
  nodeRank: number,
  jobParams: Record<string, string>,
  job = 'allreduce',
): Promise<LaunchOutcome> =>
  launch({ nproc: 2, nnodes: 2, nodeRank, server, session, token: tokenFor(session), job, timeoutSec: 120, jobParams, log: () => {} });

test('two launchers with --nnodes 2 --node-rank 0|1 --nproc 2 finish one all-reduce job as one world of 4', async ({ server }) => {
  test.setTimeout(180_000);
  const session = sessionName('nodes');
  // Neither the link's own throughput (2 x 24 MiB) nor the mesh comparison is asserted here.
  const params = { sizes: '1000,65536', iters: '2', 'measure-link': 'false', mesh: 'false' };
  const [a, b] = await Promise.all([node(server.url, session, 0, params), node(server.url, session, 1, params)]);
  expect(a.ok, JSON.stringify(a.summary)).toBe(true);
  expect(b.ok, JSON.stringify(b.summary)).toBe(true);
  for (const [o, ranks] of [
    [a, [0, 1]],
    [b, [2, 3]],
  ] as const) {
    expect(o.summary.worldSize).toBe(4);
    expect(o.summary.nodes).toEqual({ nnodes: 2, nodeRank: ranks[0] / 2, localRanks: ranks });
    expect(o.results.map((r) => r.rank).sort()).toEqual(ranks);
  }
  // The same sums on both machines: one world, one all-reduce.
  const hashes = (o: LaunchOutcome) => o.results.map((r) => (r.results as Array<{ hash: string }>).map((row) => row.hash).join(','));
  expect(new Set([...hashes(a), ...hashes(b)]).size).toBe(1);
  expect((a.summary.results as Array<{ identical: boolean }>).every((r) => r.identical)).toBe(true);
  // Each size timed both ways: back to back (nccl-tests' ms) and one alone after a barrier.
  for (const row of a.summary.results as Array<{ ms: number; afterBarrierMs: number | null }>) {
    expect(row.ms).toBeGreaterThan(0);
    expect(row.afterBarrierMs).toBeGreaterThan(0);
  }
});

test('a node that fails fails the other node too, naming it', async ({ server }) => {
  test.setTimeout(180_000);
  const session = sessionName('nodefail');
  const base = { dataset: 'synthetic', trainSize: '512', steps: '4', backend: 'cpu' };
  // Node 1 disagrees with the session's configuration: its ranks fail; node 0 must not wait forever.
  const first = node(server.url, session, 0, { ...base, lr: '0.01' }, 'train');
  // Node 1 starts once node 0's ranks have set the session's configuration (the store's key).
  await expect
    .poll(() => server.sessions.get(session)?.store.has('__train/config') ?? false, {
      message: "node 0's ranks set the session's training configuration",
      timeout: 60_000,
    })
    .toBe(true);
  const second = node(server.url, session, 1, { ...base, lr: '0.02' }, 'train');
  const [a, b] = await Promise.all([first, second]);
  expect(b.ok).toBe(false);
  expect(a.ok).toBe(false);
  expect(JSON.stringify(a.summary.errors)).toContain('node 1 failed');
});
