/**
 * StreamedDataset (src/datasets/streamed.ts): samples loaded by index as batches need them, each
 * once while cached, a bounded cache that never drops the batch being prepared, a bounded number
 * of loads in flight, and every failure named; a Subset of it streams too.
 */
import { describe, expect, it } from 'vitest';
import { StreamedDataset } from '../src/datasets/streamed.ts';
import { fetchBatch, subset } from '../src/datasets/dataset.ts';
import { errorOf } from './fixtures/errors.ts';
import { DatasetError } from '../src/datasets/dataset.ts';

/** Sample i's input is [i, i + 0.5]; loads are counted, and `gate` holds them until released. */
function fakeSource(opts: { fail?: number; wrongSize?: number } = {}) {
  const loads: number[] = [];
  let inFlight = 0;
  let peak = 0;
  const load = async (i: number): Promise<Float32Array> => {
    loads.push(i);
    inFlight++;
    peak = Math.max(peak, inFlight);
    await new Promise((r) => setTimeout(r, 2));
    inFlight--;
    if (i === opts.fail) throw new Error(`image ${i}.png: HTTP 410`);
    return i === opts.wrongSize ? new Float32Array(3) : Float32Array.of(i, i + 0.5);
  };
  return { loads, load, peak: () => peak };
}

const labels = Int32Array.from({ length: 20 }, (_, i) => i % 3);

describe('StreamedDataset', () => {
  it('loads a batch on prepare, only what it lacks, and gives the same batch an in-memory set would', async () => {
    const src = fakeSource();
    const d = new StreamedDataset({ name: 'imgs', labels, inputShape: [2], numClasses: 3, load: src.load, concurrency: 3 });
    expect(d.length).toBe(20);
    expect(() => d.batch([0])).toThrow(
      errorOf(DatasetError, /sample 0 is not loaded: a streamed dataset loads a batch's samples with prepare/),
    );
    const b = await fetchBatch(d, [4, 1, 4]);
    expect(Array.from(b.x)).toEqual([4, 4.5, 1, 1.5, 4, 4.5]);
    expect(Array.from(b.y)).toEqual([1, 1, 1]);
    await d.prepare([1, 2, 3, 4, 5, 6, 7, 8, 9]);
    // 4 and 1 were cached: 7 new loads, and never more than 3 at once.
    expect(src.loads.sort((a, c) => a - c)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(src.peak()).toBeLessThanOrEqual(3);
    expect(d.loads).toBe(9);
  });

  it('keeps at most cacheSamples, the least recently used out, never a sample of the batch being prepared', async () => {
    const src = fakeSource();
    const d = new StreamedDataset({ name: 'imgs', labels, inputShape: [2], numClasses: 3, load: src.load, cacheSamples: 4 });
    await d.prepare([0, 1, 2, 3]);
    await d.prepare([0]); // 0 used again: 1 is now the oldest
    await d.prepare([10, 11]);
    expect(() => d.batch([1])).toThrow(errorOf(DatasetError, /sample 1 is not loaded/));
    expect(() => d.batch([2])).toThrow(errorOf(DatasetError, /sample 2 is not loaded/));
    expect(Array.from(d.batch([0, 3, 10, 11]).y)).toEqual([0, 0, 1, 2]);
    await expect(d.prepare([0, 1, 2, 3, 4])).rejects.toThrow(errorOf(DatasetError, /a batch of 5 samples does not fit a cache of 4/));
  });

  it('names what failed: a load, a sample of the wrong size, an index out of range; a failed load is tried again next time', async () => {
    const src = fakeSource({ fail: 7, wrongSize: 8 });
    const d = new StreamedDataset({ name: 'imgs', labels, inputShape: [2], numClasses: 3, load: src.load });
    await expect(d.prepare([6, 7])).rejects.toThrow('image 7.png: HTTP 410');
    await expect(d.prepare([8])).rejects.toThrow(errorOf(DatasetError, /imgs: sample 8 loaded 3 values, not the 2 of \[2\]/));
    await expect(d.prepare([20])).rejects.toThrow(
      errorOf(DatasetError, /index 20 \(position 0\) is out of range for a dataset of length 20/),
    );
    await expect(d.prepare([7])).rejects.toThrow('image 7.png');
    expect(src.loads.filter((i) => i === 7)).toHaveLength(2);
  });

  it("a Subset of it streams: prepare maps its indices to the dataset's", async () => {
    const src = fakeSource();
    const d = new StreamedDataset({ name: 'imgs', labels, inputShape: [2], numClasses: 3, load: src.load });
    const test = subset(d, [9, 19], 'imgs-test');
    expect(test.prepare).toBeDefined();
    const b = await fetchBatch(test, [1, 0]);
    expect(Array.from(b.x)).toEqual([19, 19.5, 9, 9.5]);
    expect(src.loads.sort((a, c) => a - c)).toEqual([9, 19]);
    expect(subset(subset(d, [1, 2]), [0]).prepare).toBeDefined();
  });
});
