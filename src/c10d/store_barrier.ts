/**
 * The barriers that run through the store rather than the links: `ProcessGroup.barrier()` (torch's
 * store-based barrier) and, in `newGroup`, the meeting of a new subgroup's members, so that none
 * sends the subgroup frames before all have made it. Each member adds one to a counter; the last
 * to arrive sets a `done` key that every member waits for.
 */
import { DistTimeoutError, StoreTimeoutError } from '../wire/errors.ts';
import type { Store } from './store.ts';

/** The group a barrier runs in. */
export interface BarrierGroup {
  /** The group's own store (its keys apart from every other group's). */
  readonly store: Store;
  readonly worldSize: number;
  /** Rejects with the reason once the group breaks. */
  readonly broken: Promise<never>;
}

/**
 * The group's `n`-th `barrier()`. Fails as soon as the group breaks, unless every member had
 * arrived already; DistTimeoutError after `timeoutMs`, with how many arrived. `label` names a
 * subgroup in the message (" in subgroup 1 [1, 3]").
 */
export async function barrierWait(group: BarrierGroup, n: number, timeoutMs: number, label: string): Promise<void> {
  const { store, worldSize } = group;
  const key = `barrier/${n}`;
  const arrived = await store.add(key, 1);
  if (arrived === worldSize) await store.set(`${key}/done`, '1');
  try {
    await Promise.race([
      store.wait([`${key}/done`], timeoutMs),
      // A member lost after everyone arrived (e.g. one that passed first and left) is fine.
      group.broken.catch(async (err: Error) => {
        if (!(await store.check([`${key}/done`]))) throw err;
      }),
    ]);
  } catch (err) {
    if (!(err instanceof StoreTimeoutError)) throw err;
    const count = await store.add(key, 0);
    throw new DistTimeoutError(`all ${worldSize} ranks${label} to reach barrier #${n} (${count} arrived)`, timeoutMs);
  }
}

/**
 * A new subgroup's members meet (`track` runs the meeting, noting what this rank waits for). Every
 * step fails as soon as the group breaks; DistTimeoutError after `timeoutMs`, naming the subgroup
 * (`subgroup`: "subgroup 1 [1, 3]") and how many members made it.
 */
export async function meetNewGroup(
  group: BarrierGroup,
  timeoutMs: number,
  subgroup: string,
  track: (body: () => Promise<void>) => Promise<void>,
): Promise<void> {
  const { store, worldSize } = group;
  const failFast = <T>(p: Promise<T>): Promise<T> => Promise.race([p, group.broken]);
  const key = 'created';
  try {
    await track(async () => {
      const arrived = await failFast(store.add(key, 1));
      if (arrived === worldSize) await failFast(store.set(`${key}/done`, '1'));
      await failFast(store.wait([`${key}/done`], timeoutMs));
    });
  } catch (err) {
    if (!(err instanceof StoreTimeoutError)) throw err;
    const count = await store.add(key, 0).catch(() => '?');
    throw new DistTimeoutError(
      `all ${worldSize} members of ${subgroup} to call newGroup (${count} did; ` +
        'every rank must call newGroup for every subgroup, in the same order)',
      timeoutMs,
    );
  }
}
