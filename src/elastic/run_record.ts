/**
 * The run's own record (rounds trained in, steps trained again, how it resumed), which travels
 * with every state transfer and checkpoint, and the checks of it and of a run's progress as they
 * arrive from a peer or a file.
 */
import type { Progress } from '../checkpoint/state_dict.ts';

/** The run's own record, replicated with the state: a rank that joins late reports the same. */
export interface RunRecord {
  /** Rounds of the group the run trained in. */
  generations: number;
  /** Steps started but committed by nobody before a failure, and so trained again. */
  stepsRedone: number;
  /** How the run resumed: the first time and the latest (at most MAX_RESUMES notes, see `withResume`). */
  resumes: string[];
}

/**
 * Most notes a run record keeps in `resumes`: it travels with every state transfer and checkpoint,
 * so a long run with many rounds must not grow it without bound. Its counts go on regardless.
 */
export const MAX_RESUMES = 32;

/** `resumes` with `note` added: the first note (how the run began) and the latest ones, at most MAX_RESUMES. */
export function withResume(resumes: readonly string[], note: string): string[] {
  const all = [...resumes, note];
  return all.length <= MAX_RESUMES ? all : [all[0]!, ...all.slice(-(MAX_RESUMES - 1))];
}

export function isProgress(p: unknown): p is Progress {
  const ok = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
  return typeof p === 'object' && p !== null && ok((p as Progress).step) && ok((p as Progress).epoch) && ok((p as Progress).position);
}

export function isRunRecord(r: unknown): r is RunRecord {
  const x = r as RunRecord;
  return (
    typeof r === 'object' &&
    r !== null &&
    // Counts, shown on every tab (the steps trained again are in each tab's fault summary): whole and not negative.
    Number.isSafeInteger(x.generations) &&
    x.generations >= 0 &&
    Number.isSafeInteger(x.stepsRedone) &&
    x.stepsRedone >= 0 &&
    Array.isArray(x.resumes) &&
    x.resumes.every((n) => typeof n === 'string')
  );
}
