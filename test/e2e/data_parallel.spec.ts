/**
 * DataParallel on real pages: each rank's batch split over dedicated Workers, each with its own
 * TF.js backend (cpu, and WebGPU through SwiftShader in Workers), their gradients gathered and,
 * across ranks, averaged by DDP over WebRTC. The weights equal the runs without devices; a device
 * that crashes ends the run naming it and why.
 */
import { expect, launchCommand, openRanks, relativeError, sessionName, test, weightsOf } from './fixtures.ts';
import { readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

type DeviceReport = { device: number; backend: string; samples: number; steps: number; liveTensors: { min: number; max: number } | null };

const sgd = {
  job: 'train',
  dataset: 'synthetic',
  model: 'mlp',
  optimizer: 'sgd',
  lr: '0.1',
  steps: '15',
  seed: '7',
  returnWeights: 'true',
};

test('the launcher: --devices 2 on cpu at batch 32 trains to the weights of the run without devices, and the summary says devices: 2', async () => {
  const dir = tmpdir();
  const a = join(dir, `dp-a-${process.pid}.bin`);
  const b = join(dir, `dp-b-${process.pid}.bin`);
  const common = [
    '--job',
    'train',
    '--model',
    'mlp',
    '--dataset',
    'synthetic',
    '--optimizer',
    'sgd',
    '--steps',
    '15',
    '--batch-size',
    '32',
  ];
  try {
    // Side by side: two launchers, each its own server and Chromium.
    const [withDevices, without] = await Promise.all([
      launchCommand(['--nproc', '1', '--devices', '2', '--backend', 'cpu', ...common, '--dump-weights', a]),
      launchCommand(['--nproc', '1', '--backend', 'cpu', ...common, '--dump-weights', b]),
    ]);
    expect(withDevices.code, withDevices.output).toBe(0);
    expect(without.code, without.output).toBe(0);
    const s = withDevices.summary as { devices: number; deviceReports: Array<{ rank: number; devices: DeviceReport[] }>; backend: string };
    expect(s.devices).toBe(2);
    expect(without.summary.devices).toBe(1);
    expect(without.summary.deviceReports).toBeUndefined();
    expect(s.deviceReports).toHaveLength(1);
    const devices = s.deviceReports[0]!.devices;
    expect(devices.map((d) => [d.device, d.backend, d.steps, d.samples])).toEqual([
      [0, 'cpu', 15, 15 * 16],
      [1, 'cpu', 15, 15 * 16],
    ]);
    // No tensor leaks in the Workers: their live count is the same after every step.
    for (const d of devices) expect(d.liveTensors!.min).toBe(d.liveTensors!.max);
    expect(withDevices.output).toMatch(/\[launch\] devices: 2 per rank; rank 0: device 0 cpu [\d.]+ ms\/step, 240 samples; device 1 cpu/);
    const toFloats = (buf: Buffer) => new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
    const err = relativeError(toFloats(await readFile(a)), toFloats(await readFile(b)));
    console.log(`--devices 2 vs without, cpu, batch 32, 15 SGD steps: relative error ${err.toExponential(2)}`);
    expect(err).toBeLessThan(1e-5);
  } finally {
    await rm(a, { force: true });
    await rm(b, { force: true });
  }
});

test('the default backend: 2 devices on WebGPU in Workers at an uneven batch (33) equal one device; the dashboard shows them', async ({
  browser,
  server,
}) => {
  // 5 steps: each SwiftShader step costs seconds; the equality shows from the first.
  const onWebGPU = { ...sgd, steps: '5', batchSize: '33' };
  const [one] = await openRanks(browser, server, 1, { session: sessionName('dp1'), ...onWebGPU });
  const [two] = await openRanks(browser, server, 1, { session: sessionName('dp2'), ...onWebGPU, devices: '2' });
  const [r1, r2] = await Promise.all([one!.result, two!.result]);
  expect(r2!.backend).toBe('webgpu');
  const reports = r2!.deviceReports as DeviceReport[];
  // SwiftShader's WebGPU reaches Workers too: no fallback.
  expect(reports.map((d) => [d.device, d.backend, d.samples])).toEqual([
    [0, 'webgpu', 5 * 17],
    [1, 'webgpu', 5 * 16],
  ]);
  for (const d of reports) expect(d.liveTensors!.min).toBe(d.liveTensors!.max);
  const err = relativeError(weightsOf(r2!), weightsOf(r1!));
  console.log(`2 WebGPU devices vs 1, batch 33, 5 SGD steps: relative error ${err.toExponential(2)}`);
  expect(err).toBeLessThan(1e-5);
  const page = two!.page;
  await expect(page.locator('[data-fact="devices"]')).toContainText('device 0: webgpu');
  await expect(page.locator('[data-fact="devices"]')).toContainText('device 1: webgpu');
  await expect(page.locator('[data-testid="rank-devices"]').first()).toContainText('2 devices');
});

test('DDP x DataParallel: 2 ranks of 2 cpu devices at batch 16 train to 1 rank at batch 32, replicas identical every step', async ({
  browser,
  server,
}) => {
  const [single] = await openRanks(browser, server, 1, { session: sessionName('dp-one'), ...sgd, backend: 'cpu', batchSize: '32' });
  const pair = await openRanks(browser, server, 2, {
    session: sessionName('dp-ddp'),
    ...sgd,
    backend: 'cpu',
    batchSize: '16',
    devices: '2',
    checkWeights: 'true',
  });
  const [s, p0, p1] = await Promise.all([single!.result, pair[0]!.result, pair[1]!.result]);
  for (const r of [p0!, p1!]) {
    expect(r.identicalEveryStep).toBe(true);
    expect(r.devices).toBe(2);
  }
  const err = relativeError(weightsOf(p0!), weightsOf(s!));
  console.log(`2 ranks x 2 devices x 8 vs 1 rank x 32, 15 SGD steps: relative error ${err.toExponential(2)}`);
  expect(err).toBeLessThan(1e-5);
});

test('a device that crashes ends the run with an error naming the device and its reason', async ({ browser, server }) => {
  const [rank] = await openRanks(browser, server, 1, {
    session: sessionName('dp-crash'),
    ...sgd,
    backend: 'cpu',
    batchSize: '32',
    steps: '100000',
    devices: '2',
  });
  const page = rank!.page;
  // Once training runs, device 1 crashes as a Worker that dies does.
  await expect(page.locator('[data-fact="devices"]')).toContainText('device 1: cpu', { timeout: 60_000 });
  await expect.poll(() => page.evaluate(() => window.__ddpFailDevice?.(1, 'crash')), { timeout: 30_000 }).toBe('sent');
  const err = await rank!.result.then(
    () => null,
    (e: Error) => e,
  );
  expect(err?.name).toBe('DataParallelDeviceError');
  expect(err?.message).toMatch(
    /^DataParallel device 1 \(a Worker on cpu\) failed during (step \d+|its run): the Worker threw: .*a crash injected by DataParallel\.injectFault/,
  );
});
