/**
 * Parameter servers on real pages (the cpu backend: the subject is the strategy, and WebGPU's is
 * tested where the device is the subject; WebRTC between servers and workers): CentralStorage with 2 workers at batch 16 trains to one rank's weights at batch 32;
 * asynchronous training converges, a closed worker stops nobody and its samples are accounted
 * for, the staleness bound drops and counts, no push is applied twice; and, from the launcher, a
 * lost server stops the workers until a tab takes its place, which resumes from its checkpoint.
 */
import { expect, heldSteps, launchCommand, openRanks, sessionName, test, relativeError, weightsOf } from './fixtures.ts';

type Result = Record<string, unknown>;
interface Ps {
  strategy: string;
  role: 'server' | 'worker';
  index: number;
  versions: number[];
  samples: { target: number; leased: number; applied: number; stale: number; refused: number; lost: number; epoch: number };
  pushes: { applied: number; stale: number; duplicate: number; refused: number };
  staleness: { histogram: number[]; max: number | null };
  worker?: { workerId: number; pushes: number; samples: number };
}
const psOf = (r: Result) => r.parameterServer as Ps;
const accounted = (p: Ps) => p.samples.applied + p.samples.stale + p.samples.refused + p.samples.lost;

const sgd = { dataset: 'synthetic', model: 'mlp', optimizer: 'sgd', lr: '0.1', seed: '7' };

test('CentralStorage: 2 workers at batch 16 equal one rank at batch 32 after 15 SGD steps', async ({ browser, server }) => {
  // The cpu backend: the subject is the equivalence of the strategy's arithmetic, not the device
  // (four SwiftShader pages took most of this test's time).
  const [single] = await Promise.all(
    (
      await openRanks(browser, server, 1, {
        session: sessionName('one'),
        job: 'train',
        ...sgd,
        backend: 'cpu',
        steps: '15',
        batchSize: '32',
        returnWeights: 'true',
      })
    ).map((p) => p.result),
  );
  const pages = await openRanks(browser, server, 3, {
    session: sessionName('central'),
    job: 'train',
    ...sgd,
    backend: 'cpu',
    steps: '15',
    batchSize: '16',
    strategy: 'central',
    returnWeights: 'true',
  });
  const runs = await Promise.all(pages.map((p) => p.result));
  const rank0 = runs.find((r) => r.rank === 0)!;
  expect(psOf(rank0).role).toBe('server');
  expect(psOf(rank0).versions).toEqual([15]);
  const err = relativeError(weightsOf(rank0), weightsOf(single!));
  console.log(`CentralStorage 2 workers x 16 vs 1 rank x 32 after 15 SGD steps: relative error ${err.toExponential(2)}`);
  expect(err).toBeLessThanOrEqual(1e-5);
  // Every rank ends with the server's parameters.
  expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
});

test('async: training converges; a closed worker stops nobody and its samples are accounted for; no push is applied twice; the dashboard shows the server', async ({
  browser,
  server,
}) => {
  const pages = await openRanks(browser, server, 4, {
    session: sessionName('async'),
    job: 'train',
    ...sgd,
    trainSize: '4096',
    // On the cpu backend (the subject is the strategy, not the device; four SwiftShader pages
    // took most of this test's 40 s): 4 epochs, 512 pushes, so the close lands well before the end.
    epochs: '4',
    batchSize: '32',
    strategy: 'ps',
    min: '2',
    backend: 'cpu',
  });
  // The server's card: its shard, and the staleness of the pushes. With `min` set the ranks are
  // given in the order the tabs joined, not the pages' order (a loaded machine swaps them): the
  // server is whichever page's card says so.
  for (const p of pages) await expect(p.page.getByTestId('ps')).toBeVisible({ timeout: 60_000 });
  let serverAt = -1;
  await expect
    .poll(async () => {
      const roles = await Promise.all(pages.map((p) => p.page.getByTestId('ps').getAttribute('data-role')));
      serverAt = roles.indexOf('server');
      return roles.filter((r) => r === 'server').length;
    })
    .toBe(1);
  await expect(pages[serverAt]!.page.getByTestId('ps-staleness')).toBeVisible();
  const closed = serverAt === 2 ? 3 : 2;
  const worker = pages[closed]!.page;
  await expect(worker.getByTestId('ps-worker')).toBeVisible();
  // Close a worker once it has pushed a little, well before the end: 512 pushes in all, and
  // the card may show a count seconds late (its redraws are spaced out on a loaded machine). A
  // close after the end would hit the other tabs' summary, not the training (a CI run saw that).
  await expect(worker.getByTestId('ps-worker')).toContainText(/Pushes\D{0,3}([3-9]|\d\d)/, { timeout: 60_000 });
  await worker.close();
  const runs = await Promise.all(pages.filter((_, i) => i !== closed).map((p) => p.result));
  const s0 = psOf(runs.find((r) => psOf(r).role === 'server')!);
  expect(s0.samples.target).toBe(16384);
  expect(accounted(s0)).toBe(16384);
  // What the closed worker held: at most one batch (none when the close fell between two of its
  // leases, as it mostly does on the cpu backend; test/ps_runner.test.ts counts a held lease exactly).
  expect(s0.samples.lost).toBeLessThanOrEqual(32);
  // Each applied push made one version; a push delivered again after the round change was not applied again.
  expect(s0.versions[0]).toBe(s0.pushes.applied);
  expect(s0.samples.applied).toBeLessThanOrEqual(32 * s0.pushes.applied);
  for (const r of runs) expect(r.testAccuracy as number).toBeGreaterThan(0.9);
  expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
});

test('async: the staleness bound drops and counts stale pushes', async ({ browser, server }) => {
  // On the cpu backend: what is tested is the servers' accounting. On SwiftShader's WebGPU, four
  // pages on 2 cores failed here about one run in three (2026-11-25, also on earlier commits):
  // nothing from the server reached the 3x straggler for over 10 s although the server kept
  // sending (its liveness sends were not held back), so the straggler took the server for stalled
  // and the server waited out peerTimeoutMs for the straggler's next push.
  const pages = await openRanks(browser, server, 4, {
    session: sessionName('stale'),
    job: 'train',
    ...sgd,
    trainSize: '1024',
    epochs: '1',
    batchSize: '32',
    strategy: 'ps',
    maxStaleness: '0',
    slow: '3:3',
    backend: 'cpu',
  });
  const runs = await Promise.all(pages.map((p) => p.result));
  const s0 = psOf(runs.find((r) => psOf(r).role === 'server')!);
  expect(s0.pushes.stale).toBeGreaterThan(0);
  expect(s0.samples.stale).toBeGreaterThan(0);
  expect(accounted(s0)).toBe(1024);
  // Only pushes at staleness 0 were applied: the version counts them.
  expect(s0.versions[0]).toBe(s0.pushes.applied);
  expect(s0.staleness.histogram[0]).toBe(s0.pushes.applied);
});

test('launcher: a lost server stops the workers until a tab takes its place, which resumes from the shard checkpoint', async () => {
  const out = await launchCommand([
    '--nproc',
    '3',
    '--strategy',
    'ps',
    '--job',
    'train',
    '--model',
    'mlp',
    '--dataset',
    'synthetic',
    '--optimizer',
    'sgd',
    // The cpu backend: the subject is the lost server, not the device.
    '--backend',
    'cpu',
    // 256 pushes, each step held 4 times as long (a wait, not work): on the cpu backend fast
    // pushes could end the run before the kill reached the page.
    '--train-size',
    '4096',
    '--slow',
    heldSteps(3),
    '--epochs',
    '1',
    '--batch-size',
    '16',
    '--checkpoint-every',
    '8',
    // The end's evaluation on 256 samples, not 1,024.
    '--test-size',
    '256',
    // Halfway: the server's first save makes its session's folders, two fsyncs that took seconds
    // on a loaded machine (a kill before any save leaves nothing to resume from).
    '--kill',
    '0@64',
    '--join',
    '1@64',
  ]);
  const summary = out.summary;
  if (out.code !== 0) console.log(out.output.split('\n').slice(-40).join('\n'));
  expect(out.code).toBe(0);
  // The workers said which server was lost, and the new tab resumed from the shard's checkpoint.
  expect(out.output).toMatch(/Parameter server 0 was lost/);
  expect(out.output).toMatch(/Parameter server 0 resumed from checkpoint .* \(version \d+\)/);
  const ps = summary.parameterServer as { servers: Array<{ restoredFrom: number | null }>; samples: { leased: number; target: number } };
  expect(ps.servers[0]!.restoredFrom).toBeGreaterThanOrEqual(8);
  expect(ps.samples.leased).toBe(ps.samples.target);
  expect(summary.identical).toBe(true);
});
