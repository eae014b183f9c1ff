/** The group's train figures from its ranks' steps, where ranks train uneven shares of the batch (balanced batches). */
import type { RankStepMetrics } from '../train/events.ts';

/**
 * The group's loss or accuracy over some ranks' steps: each one's figure weighted by the samples
 * it trained (ranks may take uneven shares of the global batch), leaving out those without the
 * figure (null: no samples that step; or not finite); figures of jobs that do not report samples count as equal
 * shares. null when none has the figure.
 */
export function sampleWeighted(
  steps: ReadonlyArray<Pick<RankStepMetrics, 'loss' | 'accuracy' | 'samples'>>,
  key: 'loss' | 'accuracy',
): number | null {
  let weight = 0;
  let sum = 0;
  for (const m of steps) {
    const v = m[key];
    const w = m.samples ?? 1;
    if (v === null || !Number.isFinite(v) || !(w > 0)) continue;
    weight += w;
    sum += v * w;
  }
  return weight > 0 ? sum / weight : null;
}
