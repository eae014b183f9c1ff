/**
 * runElastic's communication hook state across rounds (torch: a hook registered on the DDP
 * model, its state part of the training state). Its state goes with the training state: rank 0 saves its hook's state in each checkpoint, and every rank loads it on resuming
 * from one (rank 0 whole, the others without the per-rank parts: PowerSGD's Q's and iteration,
 * error feedback from zero; see LoadCommHookStateOptions). When a round's state comes from a live
 * replica, the source sends its hook's name and state along: a rank that held no state (a
 * joiner, a rank whose device was lost) takes the shared parts of it (PowerSGD: the warm-start
 * Q's, so that it starts warm; its error feedback starts at zero, as a restarted rank's in
 * torch), and a rank that held state (a survivor, the source) keeps its own hook's state, error
 * feedback included. PowerSGD's reductions stay bit-identical on every rank whatever Q each rank
 * starts from (everything it uses after an all-reduce was all-reduced), so a survivor's Q from a
 * step that failed halfway does no harm. A rank whose hook is not the source's kind ends its run
 * with an error: every rank must run the same hook.
 *
 * `groupState`: the hook's state is the group's, the same on every rank (DiLoCo's): every rank
 * takes the source's.
 */
import type { CommHook } from '../comm_hooks/types.ts';
import type { Recovered } from '../../elastic/recovery.ts';

/**
 * Loads the hook state that came with the round's state into this rank's hook, as the top of
 * this file says: a checkpoint's on every rank (whole on rank 0, the shared parts elsewhere); a
 * replica's on a rank that held no state (the shared parts); nothing on a rank that held state.
 * Throws when the source's hook is another kind than this rank's; a checkpoint's state for
 * another hook is passed over (a run may change its hook when it resumes), and the note returned
 * says so.
 */
export function loadRecoveredHookState(
  hook: CommHook | undefined,
  hookName: string,
  r: Recovered,
  at: { wasLive: boolean; rank: number; groupState: boolean },
): string | undefined {
  const { wasLive, rank } = at;
  const { name, state } = r.commHook;
  if (r.source === 'replica') {
    if (name !== null && name !== hookName) {
      throw new Error(
        `this rank's communication hook is ${hookName}, but the group's (rank ${r.from}'s) is ${name}: every rank must run the same hook (ElasticRunOptions.commHook)`,
      );
    }
    // DiLoCo's state is the group's (the same on every rank): every rank takes the source's.
    if ((!wasLive || at.groupState) && state && state.name === hookName) hook?.loadStateDict?.(state, { otherRank: true });
    return undefined;
  }
  if (r.source !== 'checkpoint' || !state) return undefined;
  if (!hook?.loadStateDict || state.name !== hookName) {
    return `the checkpoint's ${state.name} communication hook state is not for this run's hook (${hookName}): the hook starts afresh`;
  }
  hook.loadStateDict(state, { otherRank: rank !== 0 });
  return undefined;
}
