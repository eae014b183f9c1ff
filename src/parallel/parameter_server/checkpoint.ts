/**
 * Parameter-server checkpoints: each server saves its own shard as its own part of the session's
 * checkpoints (`ps-<k>`), every `checkpointEvery` updates (the shard flags `checkpointDue`), so a
 * lost server loses at most that many updates, and those applied while a save uploads. The part's `step` is the shard's version. Shards
 * save and restore independently: in asynchronous training each shard's versions are its own.
 * `ShardSaver` makes a server's saves in the background, one at a time.
 */
import {
  CheckpointError,
  listCheckpoints,
  loadCheckpoint,
  saveCheckpoint,
  type CheckpointRequestOptions,
} from '../../checkpoint/checkpoint.ts';
import { CheckpointCorruptError, type Checkpoint } from '../../checkpoint/checkpoint_format.ts';
import type { Json } from '../../checkpoint/state_dict.ts';
import type { ParameterServerShard, ShardStateDict } from './shard.ts';
import type { PsRunEvent } from './types.ts';

/** The checkpoint part server `k` saves its shard as. */
export function psPart(k: number): string {
  return `ps-${k}`;
}

/** A shard's state dict as a checkpoint container (the shard's parameters in the model section, no topology). */
export function shardCheckpoint(sd: ShardStateDict, meta?: Json): Checkpoint {
  return {
    // `step` on top: the server names the file after it.
    meta: {
      step: sd.version,
      parameterServer: {
        index: sd.index,
        version: sd.version,
        lastSteps: sd.lastSteps,
        ...(sd.betaPowers ? { betaPowers: sd.betaPowers } : {}),
      },
      ...(meta === undefined ? {} : { user: meta }),
    },
    model: { modelTopology: null, weightSpecs: sd.params.weightSpecs, weightData: sd.params.weightData },
    optimizer: sd.optimizer,
  };
}

/** The shard state dict in a checkpoint written by `shardCheckpoint` (the shard checks the rest when it loads it). */
export function shardStateFromCheckpoint(c: Checkpoint, name?: string): ShardStateDict {
  const ps = c.meta.parameterServer as Partial<Pick<ShardStateDict, 'index' | 'version' | 'lastSteps' | 'betaPowers'>> | undefined;
  if (
    typeof ps !== 'object' ||
    ps === null ||
    typeof ps.index !== 'number' ||
    typeof ps.version !== 'number' ||
    !Array.isArray(ps.lastSteps)
  ) {
    throw new CheckpointCorruptError('header', 'it has no parameter-server shard record (was it written by saveShard?)', name);
  }
  return {
    index: ps.index,
    version: ps.version,
    lastSteps: ps.lastSteps,
    ...(ps.betaPowers === undefined ? {} : { betaPowers: ps.betaPowers }),
    params: { weightSpecs: c.model.weightSpecs, weightData: c.model.weightData },
    optimizer: c.optimizer,
  };
}

export interface ShardCheckpointOptions extends Omit<CheckpointRequestOptions, 'part'> {
  url: string;
  session: string;
}

/** Saves `shard` as part `ps-<index>` of the session's checkpoints, at its current version. */
export async function saveShard(
  shard: ParameterServerShard,
  o: ShardCheckpointOptions & { meta?: Json },
): Promise<{ name: string; bytes: number; version: number }> {
  const sd = await shard.stateDict();
  const saved = await saveCheckpoint(o.url, o.session, shardCheckpoint(sd, o.meta), { ...o, part: psPart(shard.index) });
  return { ...saved, version: sd.version };
}

/**
 * Loads `shard`'s part into it: the newest that verifies, or the newest at `version` when given;
 * returns the checkpoint's name, version and the `meta` it was saved with.
 * Returns null when the part has no checkpoint (start fresh); with `version`, a missing one is an
 * error naming the versions the part has.
 */
export async function restoreShard(
  shard: ParameterServerShard,
  o: ShardCheckpointOptions & { version?: number },
): Promise<{ name: string; version: number; meta?: Json } | null> {
  const part = psPart(shard.index);
  const request = { ...o, part };
  const loaded = await loadCheckpoint(o.url, o.session, o.version === undefined ? request : { ...request, step: o.version });
  if (!loaded) {
    if (o.version === undefined) return null;
    const versions = (await listCheckpoints(o.url, o.session, request)).map((c) => c.step ?? 'none');
    throw new CheckpointError(
      `part "${part}" of session "${o.session}" has no checkpoint at version ${o.version} (it has ${versions.length === 0 ? 'none' : `versions ${versions.join(', ')}`})`,
      o.session,
      o.url,
    );
  }
  const sd = shardStateFromCheckpoint(loaded.checkpoint, loaded.name);
  if (sd.index !== shard.index)
    throw new CheckpointCorruptError('header', `it holds shard ${sd.index}, not shard ${shard.index}`, loaded.name);
  await shard.loadStateDict(sd);
  const meta = loaded.checkpoint.meta.user;
  return { name: loaded.name, version: sd.version, ...(meta === undefined ? {} : { meta: meta as Json }) };
}

/** What a server's saves report (the run's 'checkpoint' and 'checkpoint-failed' events). */
export type ShardSaveEvent = Extract<PsRunEvent, { type: 'checkpoint' | 'checkpoint-failed' }>;

/**
 * A server's saves of its shard, in the background and one at a time. A save that falls due
 * while one is in flight is made as soon as that one ends (at the version then), not dropped:
 * dropping it let a slow save (a loaded machine, a slow upload) skip every due version until
 * training ended, so a lost server lost far more than `checkpointEvery` updates. A failed save
 * is reported and training goes on. `settle` waits for the saves, so that a run ends with its
 * last checkpoint stored and no event after its result.
 */
export class ShardSaver {
  /** Saves completed. */
  saved = 0;
  private inFlight: Promise<void> | null = null;
  private again = false;

  constructor(
    private readonly request: ShardCheckpointOptions,
    private readonly run: {
      /** The shard this tab serves now (null: none). */
      shard(): ParameterServerShard | null;
      /** The metadata to save with the shard, read as its save starts. */
      meta(index: number): Json;
      emit(e: ShardSaveEvent): void;
    },
  ) {}

  /** The shard's checkpoint is due: save it now, or once the save in flight ends. */
  due(): void {
    if (this.inFlight) {
      this.again = true;
      return;
    }
    this.inFlight = this.saveOnce().finally(() => {
      this.inFlight = null;
      if (!this.again) return;
      this.again = false;
      this.due();
    });
  }

  /** Resolves once no save is in flight or due; each save is bounded by its request's timeout (which names it). */
  async settle(): Promise<void> {
    while (this.inFlight) await this.inFlight;
  }

  private async saveOnce(): Promise<void> {
    const { shard: current, meta, emit } = this.run;
    const shard = current();
    const ended = () => this.request.signal?.aborted === true;
    if (!shard || ended()) return;
    const { index, version } = shard;
    try {
      const saved = await saveShard(shard, { ...this.request, meta: meta(index) });
      this.saved++;
      emit({ type: 'checkpoint', index, version: saved.version, name: saved.name, bytes: saved.bytes });
    } catch (err) {
      if (ended()) return; // the run was ended (its tab closed): nothing to report
      emit({ type: 'checkpoint-failed', index, version, error: err instanceof Error ? err.message : String(err) });
    }
  }
}
