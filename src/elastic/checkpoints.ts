/**
 * The run's state on the server's disk: rank 0 (or each pipeline stage, as its part) saves the
 * state dict, the run record and the hook state as a checkpoint; a round that finds no live
 * state anywhere restores the latest that verifies, and a pipeline stage its own part.
 */
import { CheckpointCorruptError } from '../checkpoint/checkpoint_format.ts';
import { CheckpointError, listCheckpoints, loadCheckpoint, saveCheckpoint, type LoadedCheckpoint } from '../checkpoint/checkpoint.ts';
import type { Json, Progress, TrainState } from '../checkpoint/state_dict.ts';
import { appendCommHookState, splitCommHookState, type HookState } from './hook_state.ts';
import { isProgress, isRunRecord, type RunRecord } from './run_record.ts';

/** Where a run's checkpoints are, and whose to resume from. */
export interface CheckpointRoutes {
  url: string;
  session: string;
  /** The session's token (the checkpoint routes require it). */
  token: string;
  /** Whose checkpoints to resume from when nobody has live state. Default: this session's. */
  resumeFrom?: string | null;
  /** That session's token. Default: `token`. */
  resumeFromToken?: string;
}

/** What restoring a checkpoint into a TrainState gives. */
export interface Restored {
  /** The run record saved with the state. */
  run: RunRecord;
  /** How the run resumed, for RunRecord.resumes. */
  note: string;
  /** Newer checkpoints passed over because they failed verification. */
  skipped: Array<{ name: string; reason: string }>;
  /** The communication hook state saved with the checkpoint (`saveState`'s `commHook`); null when it has none. */
  commHook: HookState | null;
}

/** Rank 0: loads the latest valid checkpoint of the session (or of `resumeFrom`) into `state`. */
export async function restoreFromCheckpoint(state: TrainState, o: CheckpointRoutes): Promise<Restored | null> {
  const session = o.resumeFrom ?? o.session;
  const loaded = await loadCheckpoint(o.url, session, { token: resumeToken(o) });
  if (!loaded) return null;
  return loadInto(state, loaded, `checkpoint ${loaded.name} of session "${session}"`);
}

/**
 * Loads part `o.part` of the session's checkpoints (or of `resumeFrom`'s) at step `o.step` into
 * `state`: the newest checkpoint of that part saved at that step (by `saveState(..., { part })`)
 * that verifies. How each stage of a pipeline resumes: every stage loads its own part at the
 * same step. Unlike the latest checkpoint, a missing one is an error, not a fresh start: throws
 * CheckpointError naming the part, the step and the steps the part has.
 */
export async function restoreStatePart(state: TrainState, o: CheckpointRoutes & { part: string; step: number }): Promise<Restored> {
  const session = o.resumeFrom ?? o.session;
  const request = { token: resumeToken(o), part: o.part };
  const loaded = await loadCheckpoint(o.url, session, { ...request, step: o.step });
  if (!loaded) {
    const steps = (await listCheckpoints(o.url, session, request)).map((c) => c.step ?? 'none');
    throw new CheckpointError(
      `part "${o.part}" of session "${session}" has no checkpoint at step ${o.step} (it has ${steps.length === 0 ? 'none' : `steps ${steps.join(', ')}`})`,
      session,
      o.url,
    );
  }
  return loadInto(state, loaded, `checkpoint ${loaded.name} of part "${o.part}" of session "${session}"`, o.step);
}

function resumeToken(o: CheckpointRoutes): string {
  return o.resumeFrom ? (o.resumeFromToken ?? o.token) : o.token;
}

/**
 * Loads a checkpoint written by `saveState` into `state`; `what` names it in the note. With
 * `step`, its progress must be at that step (checked before anything is loaded).
 */
async function loadInto(state: TrainState, loaded: LoadedCheckpoint, what: string, step?: number): Promise<Restored> {
  const meta = loaded.checkpoint.meta;
  const progress = meta.progress as Progress | undefined;
  const run = meta.run as RunRecord | undefined;
  if (!isProgress(progress) || !isRunRecord(run)) {
    throw new CheckpointCorruptError('header', 'it has no run progress (was it written by another program?)', loaded.name);
  }
  if (step !== undefined && progress.step !== step) {
    throw new CheckpointCorruptError('header', `its progress is at step ${progress.step}, but its meta.step says ${step}`, loaded.name);
  }
  const { optimizer, commHook } = splitCommHookState(loaded.checkpoint.meta, loaded.checkpoint.optimizer, loaded.name);
  await state.loadStateDict({ progress, extras: (meta.extras ?? null) as Json, model: loaded.checkpoint.model, optimizer });
  const skipped = loaded.skipped.map((k) => `${k.name} (${k.reason})`).join(', ');
  const note = `resumed at step ${progress.step} from ${what}${skipped ? `; skipped unusable ${skipped}` : ''}`;
  return { run, note, skipped: loaded.skipped, commHook };
}

/**
 * Rank 0 (or, with `part`, each pipeline stage) saves the state and the run record to the
 * server's disk; `part` saves it as that part of the session's checkpoints (CHECKPOINT_PART).
 * `commHook`: a communication hook's state saved with it (`meta.commHook` and the optimizer
 * section's last tensors, see `appendCommHookState`), which `Restored.commHook` gives back.
 */
export async function saveState(
  state: TrainState,
  run: RunRecord,
  o: CheckpointRoutes & { meta?: Json; part?: string; commHook?: HookState | null },
): Promise<{ name: string; bytes: number }> {
  const sd = await state.stateDict();
  const { optimizer, header } = appendCommHookState(sd.optimizer, o.commHook);
  return saveCheckpoint(
    o.url,
    o.session,
    {
      // `step` on top: the server names the file after it.
      meta: {
        step: sd.progress.step,
        progress: { ...sd.progress },
        run: { ...run },
        extras: sd.extras,
        ...(o.meta === undefined ? {} : { user: o.meta }),
        ...(header === null ? {} : { commHook: header }),
      },
      model: sd.model,
      optimizer,
    },
    { token: o.token, ...(o.part === undefined ? {} : { part: o.part }) },
  );
}
