/**
 * How a new round gets one state on every rank (torchft's recovery from the peer with the
 * highest step): the replica that committed the most steps sends its state dict to the others;
 * with no live state anywhere, rank 0 loads the latest checkpoint, or everyone starts fresh.
 * Every rank, the source too, then loads the same bytes, so replicas are bit-identical.
 */
import { CheckpointCorruptError, type WeightSpec } from '../checkpoint_format.ts';
import { loadCheckpoint, saveCheckpoint } from '../checkpoint.ts';
import type { ProcessGroup } from '../process_group.ts';
import type { Json, Progress, TrainState, TrainStateDict } from '../state_dict.ts';

/** The run's own record, replicated with the state: a rank that joins late reports the same. */
export interface RunRecord {
  /** Rounds of the group the run trained in. */
  generations: number;
  /** Steps started but committed by nobody before a failure, and so trained again. */
  stepsRedone: number;
  /** How the run resumed, each time it did. */
  resumes: string[];
}

export interface Recovered {
  run: RunRecord;
  source: 'fresh' | 'replica' | 'checkpoint';
  from: number;
  redone: boolean;
  note?: string;
  /** Newer checkpoints passed over because they failed verification. */
  skipped: Array<{ name: string; reason: string }>;
}

export interface RecoveryOptions {
  url: string;
  session: string;
  /** The session's token (the checkpoint routes require it). */
  token: string;
  /** Whose checkpoints to resume from when nobody has live state. Default: this session's. */
  resumeFrom?: string | null;
  /** That session's token. Default: `token`. */
  resumeFromToken?: string;
}

/**
 * Gives every rank of `pg` the same state. `live` says whether this rank holds a state worth
 * keeping; `inFlight` is the step it had started but not committed when its last round failed.
 */
export async function recover(pg: ProcessGroup, state: TrainState, run: RunRecord, live: boolean, inFlight: number, o: RecoveryOptions): Promise<Recovered> {
  const status = await pg.allGather(Float32Array.of(live ? state.progress.step : -1, inFlight));
  let best = -1;
  let source = 0;
  for (let r = 0; r < pg.worldSize; r++) {
    if (status[2 * r]! > best) {
      best = status[2 * r]!;
      source = r;
    }
  }
  if (best < 0) {
    // Nobody has trained yet: a checkpoint, if there is one, else the seed.
    const restored = pg.rank === 0 ? await restoreFromCheckpoint(state, o) : null;
    const flag = await pg.broadcast(Float32Array.of(restored ? 1 : 0), 0);
    if (flag[0] === 0) return { run: { generations: 0, stepsRedone: 0, resumes: [] }, source: 'fresh', from: 0, redone: false, skipped: [] };
    const shared = await broadcastState(pg, 0, state, restored);
    const note = shared.note ?? 'resumed from a checkpoint';
    return { run: { ...shared.run, resumes: [...shared.run.resumes, note] }, source: 'checkpoint', from: 0, redone: false, note, skipped: restored?.skipped ?? [] };
  }
  // A step some rank had started but nobody committed is trained again.
  let redone = false;
  for (let r = 0; r < pg.worldSize; r++) if (status[2 * r + 1] === best + 1) redone = true;
  const shared = await broadcastState(pg, source, state, pg.rank === source ? { run } : null);
  const note = `resumed at step ${state.progress.step} from the replica of rank ${source}${redone ? `; step ${best + 1} is trained again` : ''}`;
  return {
    run: { ...shared.run, stepsRedone: shared.run.stepsRedone + (redone ? 1 : 0), resumes: [...shared.run.resumes, note] },
    source: 'replica',
    from: source,
    redone,
    note,
    skipped: [],
  };
}

interface Header {
  progress: Progress;
  extras: Json;
  run: RunRecord;
  note?: string;
  modelSpecs: WeightSpec[];
  modelBytes: number;
  optimizerSpecs: WeightSpec[];
  optimizerBytes: number;
}

/**
 * Sends `source`'s state (and run record) to every rank of `pg`: a small JSON header, then the
 * model's and the optimizer's bytes. Every rank, the source too, loads what was sent.
 */
async function broadcastState(pg: ProcessGroup, source: number, state: TrainState, mine: { run: RunRecord; note?: string } | null): Promise<{ run: RunRecord; note?: string }> {
  let sd: TrainStateDict | undefined;
  let words = new Float32Array(0);
  if (pg.rank === source) {
    sd = await state.stateDict();
    const header: Header = {
      progress: sd.progress,
      extras: sd.extras,
      run: mine!.run,
      note: mine!.note,
      modelSpecs: sd.model.weightSpecs,
      modelBytes: sd.model.weightData.byteLength,
      optimizerSpecs: sd.optimizer.weightSpecs,
      optimizerBytes: sd.optimizer.weightData.byteLength,
    };
    const json = new TextEncoder().encode(JSON.stringify(header));
    words = new Float32Array(Math.ceil(json.length / 4));
    new Uint8Array(words.buffer).set(json);
  }
  const length = await pg.broadcast(Float32Array.of(words.length), source);
  if (pg.rank !== source) words = new Float32Array(length[0]!);
  await pg.broadcast(words, source);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(words.buffer)).replace(/\0+$/, '')) as Header;
  // Weights and optimizer state travel as raw 4-byte words: bytes are copied, never computed on.
  const model = pg.rank === source ? new Float32Array(sd!.model.weightData) : new Float32Array(wordsOf(header.modelBytes));
  await pg.broadcast(model, source);
  const optimizer = pg.rank === source ? new Float32Array(sd!.optimizer.weightData) : new Float32Array(wordsOf(header.optimizerBytes));
  await pg.broadcast(optimizer, source);
  await state.loadStateDict({
    progress: header.progress,
    extras: header.extras,
    model: { modelTopology: null, weightSpecs: header.modelSpecs, weightData: model.buffer as ArrayBuffer },
    optimizer: { weightSpecs: header.optimizerSpecs, weightData: optimizer.buffer as ArrayBuffer },
  });
  return { run: header.run, note: header.note };
}

function wordsOf(bytes: number): number {
  if (!Number.isSafeInteger(bytes) || bytes < 0 || bytes % 4 !== 0) throw new RangeError(`a state of ${bytes} bytes is not made of 4-byte values`);
  return bytes / 4;
}

/** Rank 0: loads the latest valid checkpoint of the session (or of `resumeFrom`) into `state`. */
async function restoreFromCheckpoint(state: TrainState, o: RecoveryOptions): Promise<{ run: RunRecord; note: string; skipped: Array<{ name: string; reason: string }> } | null> {
  const session = o.resumeFrom ?? o.session;
  const loaded = await loadCheckpoint(o.url, session, { token: o.resumeFrom ? (o.resumeFromToken ?? o.token) : o.token });
  if (!loaded) return null;
  const meta = loaded.checkpoint.meta;
  const progress = meta.progress as Progress | undefined;
  const run = meta.run as RunRecord | undefined;
  if (!isProgress(progress) || !isRunRecord(run)) {
    throw new CheckpointCorruptError('header', 'it has no run progress (was it written by another program?)', loaded.name);
  }
  await state.loadStateDict({ progress, extras: (meta.extras ?? null) as Json, model: loaded.checkpoint.model, optimizer: loaded.checkpoint.optimizer });
  const skipped = loaded.skipped.map((k) => `${k.name} (${k.reason})`).join(', ');
  const note = `resumed at step ${progress.step} from checkpoint ${loaded.name} of session "${session}"${skipped ? `; skipped unusable ${skipped}` : ''}`;
  return { run, note, skipped: loaded.skipped };
}

/** Rank 0 saves the state and the run record to the server's disk. */
export async function saveState(state: TrainState, run: RunRecord, o: RecoveryOptions & { meta?: Json }): Promise<{ name: string; bytes: number }> {
  const sd = await state.stateDict();
  return saveCheckpoint(o.url, o.session, {
    // `step` on top: the server names the file after it.
    meta: { step: sd.progress.step, progress: { ...sd.progress }, run: { ...run }, extras: sd.extras, ...(o.meta === undefined ? {} : { user: o.meta }) },
    model: sd.model,
    optimizer: sd.optimizer,
  }, { token: o.token });
}

function isProgress(p: unknown): p is Progress {
  const ok = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
  return typeof p === 'object' && p !== null && ok((p as Progress).step) && ok((p as Progress).epoch) && ok((p as Progress).position);
}

function isRunRecord(r: unknown): r is RunRecord {
  const x = r as RunRecord;
  return typeof r === 'object' && r !== null && typeof x.generations === 'number' && typeof x.stepsRedone === 'number' && Array.isArray(x.resumes);
}
