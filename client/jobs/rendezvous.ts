/** Job `rendezvous`: join, pass a barrier, report rank, world size and WebGPU adapter. */
import { joinGroup, type JobContext } from './job.ts';
import { probeWebGpu } from '../webgpu.ts';

export async function rendezvousJob(ctx: JobContext): Promise<Record<string, unknown>> {
  const gpu = await probeWebGpu();
  ctx.log(gpu.available ? `WebGPU adapter: ${gpu.adapter}` : `no WebGPU: ${gpu.reason}`);
  const pg = await joinGroup(ctx);
  ctx.log(`joined as rank ${pg.rank} of ${pg.worldSize}`);
  await pg.barrier();
  ctx.log('passed the barrier');
  pg.destroy();
  return {
    rank: pg.rank,
    worldSize: pg.worldSize,
    adapter: gpu.adapter,
    webgpu: gpu.available,
    ...(gpu.reason ? { reason: gpu.reason } : {}),
  };
}
