/**
 * Values riding on DDP's last bucket (`DistributedDataParallel.carry`): small per-step figures
 * (runElastic's vote) summed in the same all-reduce as the gradients, so that they cost no
 * meeting of their own.
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';

export class CarriedValues {
  /** Values to ride on the next synchronised backward's last reduction, and their sums once it ran. */
  private out: Float32Array | null = null;
  private sums: Float32Array | null = null;

  /** Values waiting to ride (the next backward's `carriedValues`). */
  get pending(): number {
    return this.out?.length ?? 0;
  }

  /** `values` ride on the next last bucket (null: none); clears sums not yet taken. */
  set(values: Float32Array | null): void {
    this.sums = null;
    this.out = values;
  }

  /** The sums once carried (null when none since), clearing them and anything still waiting. */
  take(): Float32Array | null {
    const sums = this.sums;
    this.sums = null;
    this.out = null;
    return sums;
  }

  /**
   * When values wait, all-reduces [view, values] as one 'sum' and divides the bucket by the world
   * size after (as 'avg' divides its float32 sums: the same bits as the bucket reduced alone);
   * resolves with whether it did (else the caller reduces the bucket itself).
   */
  async reduceWith(pg: ProcessGroup, view: Float32Array): Promise<boolean> {
    const extra = this.out;
    if (!extra) return false;
    this.out = null;
    const both = new Float32Array(view.length + extra.length);
    both.set(view);
    both.set(extra, view.length);
    await pg.allReduce(both, 'sum');
    const n = pg.worldSize;
    for (let i = 0; i < view.length; i++) view[i] = both[i]! / n;
    this.sums = both.subarray(view.length);
    return true;
  }
}
