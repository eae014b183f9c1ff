/**
 * How a new round gets one state on every rank (torchft's recovery from a live peer): a replica
 * that held the group's state in an earlier round sends its state dict to the others (the rule
 * is at `chooseSource`); with no live state anywhere, rank 0 loads the latest checkpoint, or
 * everyone starts fresh. Only the ranks that lack the source's state get it: each live rank sends
 * a digest of its state with its claim; nothing is sent when every digest is the source's, a few
 * ranks that lack it get it point to point from ranks that hold it, and many get it in one
 * broadcast from the source. Every rank that gets or holds it then loads the same bytes, so
 * replicas are bit-identical. What a peer sends is checked against this rank's own model before
 * anything is allocated or loaded.
 *
 * A DDP communication hook's state (PowerSGD's Q matrices and error feedback) goes along: the
 * source sends its hook's name and state with its state dict (the checkpoint's, when the state
 * comes from one), and `recover` hands them back as `Recovered.commHook`; which ranks load it is
 * the caller's choice (runElastic: see its `commHook` option). In a checkpoint the hook's state is
 * `meta.commHook` (a CommHookStateHeader: name, meta, tensors' names and lengths) with the
 * tensors' values after the optimizer's in the optimizer section (specs `commHook/<tensor>`,
 * float32, 1-D), so that the server's checks of the sections hold; a checkpoint without
 * `meta.commHook` (every one saved before) has no hook state and loads as before.
 */
import type * as tf from '@tensorflow/tfjs';
import { CheckpointCorruptError, type WeightSpec } from '../checkpoint/checkpoint_format.ts';
import { CheckpointError, listCheckpoints, loadCheckpoint, saveCheckpoint, type LoadedCheckpoint } from '../checkpoint/checkpoint.ts';
import { StateTransferError } from '../wire/errors.ts';
import { digest48 } from '../wire/hash.ts';
import { commHookStateElements, CommHookStateFormatError, flattenCommHookState, readCommHookStateHeader, unflattenCommHookState, type CommHookStateHeader } from './hook_state.ts';
import type { CommHookState } from '../parallel/comm_hooks/types.ts';
import type { ProcessGroup } from '../c10d/process_group.ts';
import type { Json, Progress, TensorBundle, TrainState, TrainStateDict } from '../checkpoint/state_dict.ts';

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

export interface Recovered {
  run: RunRecord;
  source: 'fresh' | 'replica' | 'checkpoint';
  from: number;
  redone: boolean;
  /** Whether a state was sent: false when every rank already held the same one (or all start fresh). */
  transferred: boolean;
  /** How long this rank took to hold every rank's claim (reading its state, the round's links, one all-gather). */
  claimsMs: number;
  note?: string;
  /** Newer checkpoints passed over because they failed verification. */
  skipped: Array<{ name: string; reason: string }>;
  /**
   * The communication hook of the state's source: for 'replica', the source's hook's name and
   * its state (null for a hook without state, or a source that sent none); for 'checkpoint', the
   * state saved in it (its name, or null without one); for 'fresh', both null.
   */
  commHook: { name: string | null; state: CommHookState | null };
}

/** A rank's communication hook, as `recover` sees it: its name and, when it keeps state, its state now. */
export interface RecoveryHook {
  name: string;
  state(): CommHookState | null;
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
  /**
   * Whether ranks that all hold the same state keep it, nothing sent (default true): each live
   * rank digests its state and sends the digest with its claim. False where equal bytes are not
   * enough (DiLoCo: the round's outer step needs the source's group state on every rank).
   */
  keepSameState?: boolean;
}

/** A round of the group: which server instance formed it, and its number there. */
export interface RoundRef {
  instance: string;
  round: number;
}

/** What a rank brings to a new round. */
export interface StateClaim {
  /** Whether this rank holds a state worth keeping (it trained, or received a state). */
  live: boolean;
  /** The step it had started but not committed when its last round failed, or -1. */
  inFlight: number;
  /** The latest round in which it got (or kept) the group's state and trained; null if none. */
  heldIn: RoundRef | null;
}

/** One rank's claim as gathered: numbers only, each checked, since a peer may send anything. */
interface Status {
  rank: number;
  live: boolean;
  step: number;
  inFlight: number;
  /** Instance tag and round of `heldIn`, or -1. */
  instance: number;
  round: number;
  /** The state's digest (48 bits), or null where the rank sent none or a malformed one. */
  digest: number | null;
}

/**
 * Gives every rank of `pg` the same state, from the source `chooseSource` picks among the ranks'
 * claims (or a checkpoint, or the seed, when nobody has live state).
 */
export async function recover(pg: ProcessGroup, state: TrainState, run: RunRecord, claim: StateClaim, o: RecoveryOptions, hook?: RecoveryHook): Promise<Recovered> {
  const started = performance.now();
  const keep = o.keepSameState ?? true;
  // A live rank's state, read once: its digest goes with the claim, and the source sends it.
  const sd = claim.live && keep ? await state.stateDict() : undefined;
  const [digestHi, digestLo] = sd ? stateDigest(sd, run) : [-1, -1];
  const mine = Float32Array.of(
    claim.live ? state.progress.step : -1,
    claim.inFlight,
    claim.heldIn ? instanceTag(claim.heldIn.instance) : -1,
    claim.heldIn ? claim.heldIn.round : -1,
    digestHi,
    digestLo,
  );
  const gathered = await pg.allGather(mine);
  const claimsMs = performance.now() - started;
  const statuses = Array.from({ length: pg.worldSize }, (_, r) => readStatus(r, gathered.subarray(CLAIM_WORDS * r, CLAIM_WORDS * r + CLAIM_WORDS)));
  const source = chooseSource(statuses, { instance: instanceTag(pg.instance), round: pg.round });
  if (source === undefined) {
    // Nobody has trained yet: a checkpoint, if there is one, else the seed.
    const restored = pg.rank === 0 ? await restoreFromCheckpoint(state, o) : null;
    const flag = await pg.broadcast(Float32Array.of(restored ? 1 : 0), 0);
    if (flag[0] === 0) return { run: { generations: 0, stepsRedone: 0, resumes: [] }, source: 'fresh', from: 0, redone: false, transferred: false, claimsMs, skipped: [], commHook: { name: null, state: null } };
    const mine = restored ? { run: restored.run, note: restored.note, commHook: restored.commHook, commHookName: restored.commHook?.name } : null;
    const shared = await broadcastState(pg, 0, state, mine);
    const note = shared.note ?? 'resumed from a checkpoint';
    return {
      run: { ...shared.run, resumes: withResume(shared.run.resumes, note) },
      source: 'checkpoint',
      from: 0,
      redone: false,
      transferred: true,
      claimsMs,
      note,
      skipped: restored?.skipped ?? [],
      commHook: shared.commHook,
    };
  }
  // A step past the source's that some rank had started (or, one step ahead of the others,
  // committed alone before the round failed) is trained again.
  const best = statuses[source]!.step;
  const redone = statuses.some((s) => s.inFlight === best + 1 || (s.live && s.step === best + 1));
  const again = redone ? `; step ${best + 1} is trained again` : '';
  const extras = (): SourceExtras => ({ run, commHookName: hook?.name, commHook: hook?.state() ?? null, sd });
  const holders = statuses.filter((s) => s.rank === source || (keep && sameAs(s, statuses[source]!))).map((s) => s.rank);
  const needers = statuses.filter((s) => !holders.includes(s.rank)).map((s) => s.rank);
  let shared: Shared | null;
  let note: string;
  if (needers.length === 0) {
    // Every rank already holds the source's bytes (a kill among survivors between steps): nothing
    // to send. Each keeps its own hook state, as a rank that held state does after a transfer.
    shared = null;
    note = `resumed at step ${best}: every rank held the replica of rank ${source}, nothing sent${again}`;
  } else if (needers.length <= P2P_PER_HOLDER * holders.length) {
    // A few ranks lack it (those a step behind after a kill mid-all-reduce, a joiner): the
    // ranks that hold it send it to them, and nobody else waits for anything.
    shared = await sendToNeeders(pg, holders, needers, state, extras());
    note = `resumed at step ${best} from the replica of rank ${source}, sent to ${needers.length} rank${needers.length === 1 ? '' : 's'}${again}`;
  } else {
    shared = await broadcastState(pg, source, state, pg.rank === source ? extras() : null);
    note = `resumed at step ${best} from the replica of rank ${source}${again}`;
  }
  // A rank that held the state keeps its own run record: its digest says it is the source's.
  const record = shared?.run ?? run;
  return {
    run: { ...record, stepsRedone: record.stepsRedone + (redone ? 1 : 0), resumes: withResume(record.resumes, note) },
    source: 'replica',
    from: source,
    redone,
    transferred: needers.length > 0,
    claimsMs,
    note,
    skipped: [],
    commHook: shared?.commHook ?? { name: hook?.name ?? null, state: null },
  };
}

/**
 * Sent point to point while each holder of the state has at most this many ranks to send it to;
 * past that, one broadcast from the source (a tree) costs less than a holder sending the whole
 * state to many ranks over its own links.
 */
const P2P_PER_HOLDER = 2;

/** Numbers in a rank's claim: step, step in flight, instance tag, round, and the state's digest in two halves. */
const CLAIM_WORDS = 6;

/**
 * Whether `s` holds the same state as the source `src`: live, held in the same round at the same
 * step, with the same digest (a rank without one, or with a malformed one, differs). Survivors of
 * a round committed the same steps from the same all-reduced gradients, so after a kill most
 * match; local SGD's drifting replicas, a joiner or a rank a step behind do not.
 */
function sameAs(s: Status, src: Status): boolean {
  return s.live && s.digest !== null && s.digest === src.digest && s.step === src.step && s.instance === src.instance && s.round === src.round;
}

/** What a state transfer would make every rank hold: progress, extras, run record, model and optimizer bytes. */
function stateDigest(sd: TrainStateDict, run: RunRecord): [number, number] {
  // Shapes and types, not names: TF.js names layers by a counter of its own in each page.
  const layout = (specs: WeightSpec[]) => specs.map((w) => [w.shape, w.dtype]);
  const text = new TextEncoder().encode(JSON.stringify([sd.progress, sd.extras, run, layout(sd.model.weightSpecs), layout(sd.optimizer.weightSpecs)]));
  return digest48([text, new Uint8Array(sd.model.weightData), new Uint8Array(sd.optimizer.weightData)]);
}

/**
 * Which live rank's state the round takes; undefined when no rank has any.
 *
 * The rule: the source is never chosen by the step a rank claims (any member could claim a huge
 * one), but by who it is. Among the live ranks that held the group's state in a round of this
 * server instance, the lowest rank is the source. The server lists a round's members before the
 * members that arrive, and every member takes part in every round formed while it is connected;
 * so the lowest of them has been in the group longest and took part in every step committed
 * since it joined: it holds the latest committed state (at most the one step in flight behind a
 * rank that committed it alone, which is then trained again). Every survivor of the last round
 * holds the same steps as it (they committed them together), so none needs to be believed over
 * it; a joiner, whatever it claims, comes after the survivors and cannot win while one is here.
 * (In a fixed-size group a round without every rank is paused, so all live ranks trained in the
 * same last round; but a tab that asks for the rank of one that left takes its place in the
 * order, so there the lowest rank is trusted as it is.) After a server restart no rank has a round of the new instance, and arrival order says
 * nothing; then the ranks that claim the latest round of the lowest live rank's instance are
 * eligible, and again the lowest of them is the source. Impossible claims (a round of this
 * instance not before the current one, a malformed number) count as no state.
 */
function chooseSource(statuses: Status[], current: { instance: number; round: number }): number | undefined {
  const live = statuses.filter((s) => s.live && !(s.instance === current.instance && s.round >= current.round));
  const here = live.find((s) => s.instance === current.instance);
  if (here) return here.rank;
  const first = live[0];
  if (!first) return undefined;
  const sameInstance = live.filter((s) => s.instance === first.instance);
  const latest = Math.max(...sameInstance.map((s) => s.round));
  return sameInstance.find((s) => s.round === latest)!.rank;
}

function readStatus(rank: number, v: Float32Array): Status {
  const int = (x: number, min: number) => (Number.isSafeInteger(x) && x >= min ? x : undefined);
  const step = int(v[0]!, 0);
  const inFlight = int(v[1]!, -1) ?? -1;
  const instance = int(v[2]!, 0);
  const round = int(v[3]!, 0);
  // A live state always comes with the round it was held in.
  const live = step !== undefined && instance !== undefined && round !== undefined;
  const half = (x: number) => (Number.isInteger(x) && x >= 0 && x < 0x1000000 ? x : undefined);
  const hi = half(v[4]!);
  const lo = half(v[5]!);
  const digest = live && hi !== undefined && lo !== undefined ? hi * 0x1000000 + lo : null;
  return { rank, live, step: step ?? -1, inFlight, instance: live ? instance : -1, round: live ? round : -1, digest };
}

/** 24 bits of the instance id: a float32 holds them exactly. */
function instanceTag(instance: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < instance.length; i++) h = Math.imul(h ^ instance.charCodeAt(i), 0x01000193);
  return (h >>> 0) & 0xffffff;
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
  /** The source's communication hook's name (absent from a source without one to name: a checkpoint without hook state). */
  commHookName?: string;
  /** Its state without the values, which follow the optimizer's in a broadcast of their own; absent or null for none. */
  commHook?: CommHookStateHeader | null;
}

/** What the source of a state transfer sends besides its TrainState. */
interface SourceExtras {
  run: RunRecord;
  /** The source's state as already read (else it is read here). */
  sd?: TrainStateDict;
  note?: string;
  commHookName?: string;
  commHook?: CommHookState | null;
}

/**
 * The most values a hook state sent with a replica's state may hold: four per trainable
 * parameter of the receiving model, plus 65536 (PowerSGD keeps at most two: a Q and an error).
 */
export function maxCommHookElements(model: tf.LayersModel): number {
  const params = model.trainableWeights.reduce((a, w) => a + numel(w.shape as number[]), 0);
  return 4 * params + 65_536;
}

/** The largest header (progress, run record, weight specs, the user's extras, as JSON) a rank accepts. */
export const MAX_STATE_HEADER_BYTES = 16 << 20;

/** What a transfer hands back to the rank that received it. */
interface Shared {
  run: RunRecord;
  note?: string;
  commHook: { name: string | null; state: CommHookState | null };
}

/**
 * Sends `source`'s state (and run record, and hook state) to every rank of `pg`: a small JSON
 * header (its length, then itself), then in one broadcast the model's and the optimizer's bytes
 * and the hook state's values when the header announces some. Every rank, the source too, checks
 * the header against its own model before allocating what it announces, then loads what was sent
 * (the hook state is returned, not loaded).
 */
async function broadcastState(pg: ProcessGroup, source: number, state: TrainState, mine: SourceExtras | null): Promise<Shared> {
  const packed = pg.rank === source ? await packState(state, mine!) : null;
  const length = await pg.broadcast(Float32Array.of(packed ? packed.header.length : 0), source);
  // The source checks its own too, so that a header too big fails every rank alike.
  const words = packed ? packed.header : new Float32Array(headerWords(source, length[0]!));
  await pg.broadcast(words, source);
  const { header, layout, bodyWords } = readHeader(source, words, state.model);
  if (packed && packed.body.length !== bodyWords) throw new StateTransferError(source, 'communication hook state', `its header announces ${bodyWords} words of state, its tensors hold ${packed.body.length}`);
  // Weights, optimizer state and the hook's values in one broadcast: each broadcast is a round
  // trip through the whole group (at 32 tabs on two cores about 0.6 s).
  const body = packed ? packed.body : new Float32Array(bodyWords);
  await pg.broadcast(body, source);
  return loadState(state, header, layout, body);
}

/**
 * The state to the ranks that lack it, point to point: each rank of `holders` (which hold the
 * source's bytes, by their digests) sends its header's length, the header and the body to each
 * rank of `needers` dealt to it (to all of them at once, each one's three messages in order,
 * without waiting for an answer); the others take part in nothing. One message's latency rather
 * than three broadcasts' through the whole group.
 */
async function sendToNeeders(pg: ProcessGroup, holders: number[], needers: number[], state: TrainState, mine: SourceExtras): Promise<Shared | null> {
  const senderOf = (k: number) => holders[k % holders.length]!;
  const me = pg.rank;
  if (holders.includes(me)) {
    const sd = mine.sd ?? (await state.stateDict());
    const mineToSend = needers.filter((_, k) => senderOf(k) === me);
    if (mineToSend.length > 0) {
      const packed = await packState(state, { ...mine, sd });
      await Promise.all(
        mineToSend.map(async (dst) => {
          await pg.send(Float32Array.of(packed.header.length), dst);
          await pg.send(packed.header, dst);
          await pg.send(packed.body, dst);
        }),
      );
    }
    // A holder loads its own bytes as the receivers load them: every rank then runs an optimizer
    // restored from the same bytes (a restored Adam's beta powers can differ in the last bit
    // from a running one's: see TrainStateOptions.optimizer).
    await state.loadStateDict(sd);
    return null;
  }
  const k = needers.indexOf(me);
  const from = senderOf(k);
  const length = await pg.recv(new Float32Array(1), from);
  const words = await pg.recv(new Float32Array(headerWords(from, length[0]!)), from);
  const { header, layout, bodyWords } = readHeader(from, words, state.model);
  const body = await pg.recv(new Float32Array(bodyWords), from);
  return loadState(state, header, layout, body);
}

/** A source's state as it travels: the header's JSON in 4-byte words, and the body (weights, optimizer state, hook values). */
async function packState(state: TrainState, mine: SourceExtras): Promise<{ header: Float32Array; body: Float32Array }> {
  const sd = mine.sd ?? (await state.stateDict());
  const hook = mine.commHook ? flattenCommHookState(mine.commHook) : null;
  const header: Header = {
    progress: sd.progress,
    extras: sd.extras,
    run: mine.run,
    note: mine.note,
    modelSpecs: sd.model.weightSpecs,
    modelBytes: sd.model.weightData.byteLength,
    optimizerSpecs: sd.optimizer.weightSpecs,
    optimizerBytes: sd.optimizer.weightData.byteLength,
    ...(mine.commHookName === undefined ? {} : { commHookName: mine.commHookName }),
    commHook: hook?.header ?? null,
  };
  const json = new TextEncoder().encode(JSON.stringify(header));
  const words = new Float32Array(Math.ceil(json.length / 4));
  new Uint8Array(words.buffer).set(json);
  // They travel as raw 4-byte words, copied as bytes, never computed on.
  const hookBytes = hook ? new Uint8Array(hook.data.buffer, hook.data.byteOffset, hook.data.byteLength) : new Uint8Array(0);
  const body = new Float32Array((sd.model.weightData.byteLength + sd.optimizer.weightData.byteLength + hookBytes.byteLength) / 4);
  const bytes = new Uint8Array(body.buffer);
  bytes.set(new Uint8Array(sd.model.weightData), 0);
  bytes.set(new Uint8Array(sd.optimizer.weightData), sd.model.weightData.byteLength);
  bytes.set(hookBytes, sd.model.weightData.byteLength + sd.optimizer.weightData.byteLength);
  return { header: words, body };
}

/** A declared header length, checked before anything is allocated for it. */
function headerWords(source: number, declared: number): number {
  if (!Number.isSafeInteger(declared) || declared < 0 || declared * 4 > MAX_STATE_HEADER_BYTES) {
    throw new StateTransferError(source, 'header', `a header of ${declared} 4-byte words is not a length up to ${MAX_STATE_HEADER_BYTES} bytes`);
  }
  return declared;
}

/** The header from `source`, checked against this rank's model, and the body's length it announces. */
function readHeader(source: number, words: Float32Array, model: tf.LayersModel): { header: Header; layout: ReturnType<typeof checkLayout>; bodyWords: number } {
  const header = parseHeader(source, words);
  const layout = checkLayout(source, header, model);
  const hookWords = layout.commHook ? commHookStateElements(layout.commHook) : 0;
  return { header, layout, bodyWords: (layout.modelBytes + layout.optimizerBytes) / 4 + hookWords };
}

/** Loads a received body into `state`; the hook's values are returned, not loaded. */
async function loadState(state: TrainState, header: Header, layout: ReturnType<typeof checkLayout>, body: Float32Array): Promise<Shared> {
  const bytes = new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  const model = bytes.slice(0, layout.modelBytes).buffer;
  const optimizer = bytes.slice(layout.modelBytes, layout.modelBytes + layout.optimizerBytes).buffer;
  const hookState = layout.commHook ? unflattenCommHookState(layout.commHook, body.slice((layout.modelBytes + layout.optimizerBytes) / 4)) : null;
  await state.loadStateDict({
    progress: header.progress,
    extras: header.extras,
    model: { modelTopology: null, weightSpecs: layout.modelSpecs, weightData: model },
    optimizer: { weightSpecs: layout.optimizerSpecs, weightData: optimizer },
  });
  return { run: header.run, note: header.note, commHook: { name: header.commHookName ?? hookState?.name ?? null, state: hookState } };
}

/** The header's JSON, its fields checked; the weight specs are checked by `checkLayout`. */
function parseHeader(source: number, words: Float32Array): Header {
  const bad = (why: string) => new StateTransferError(source, 'header', why);
  let raw: unknown;
  try {
    raw = JSON.parse(new TextDecoder().decode(new Uint8Array(words.buffer, words.byteOffset, words.byteLength)).replace(/\0+$/, ''));
  } catch {
    throw bad('it is not JSON');
  }
  if (typeof raw !== 'object' || raw === null) throw bad('it is not a JSON object');
  const h = raw as Partial<Header>;
  if (!isProgress(h.progress)) throw bad('its progress is not {step, epoch, position} of non-negative integers');
  if (!isRunRecord(h.run)) throw bad('its run record is not {generations, stepsRedone, resumes}');
  if (h.note !== undefined && typeof h.note !== 'string') throw bad('its note is not a string');
  if (!Array.isArray(h.modelSpecs) || !Array.isArray(h.optimizerSpecs)) throw bad('its weight specs are not lists');
  if (typeof h.modelBytes !== 'number' || typeof h.optimizerBytes !== 'number') throw bad('its byte counts are not numbers');
  if (h.commHookName !== undefined && (typeof h.commHookName !== 'string' || h.commHookName.length > 1_000)) throw bad('its communication hook name is not a string');
  return { ...h, extras: h.extras ?? null } as Header;
}

/**
 * Checks the announced weights against this rank's own model, before anything is allocated:
 * the model's specs must be its weights' shapes and types, in order; each optimizer slot a scalar
 * (the step count) or the shape of a trainable weight (moments), at most three per weight; and
 * both byte counts what those specs make. Returns clean specs (names unique) to load.
 */
function checkLayout(
  source: number,
  h: Header,
  model: tf.LayersModel,
): { modelSpecs: WeightSpec[]; modelBytes: number; optimizerSpecs: WeightSpec[]; optimizerBytes: number; commHook: CommHookStateHeader | null } {
  const weights = model.weights;
  if (h.modelSpecs.length !== weights.length) {
    throw new StateTransferError(source, 'model', `it sends ${h.modelSpecs.length} weight tensors, this model has ${weights.length}`);
  }
  const names = new Set<string>();
  const cleanName = (spec: unknown, where: string): string => {
    const name = (spec as Partial<WeightSpec> | null)?.name;
    if (typeof name !== 'string' || name.length > 1_000 || names.has(name)) throw new StateTransferError(source, where, 'its name is missing, too long or repeated');
    names.add(name);
    return name;
  };
  let modelBytes = 0;
  const modelSpecs = h.modelSpecs.map((spec: unknown, i): WeightSpec => {
    const w = weights[i]!;
    const where = `parameter ${i} (${w.originalName})`;
    const s = spec as Partial<WeightSpec> | null;
    if (!sameShape(s?.shape, w.shape) || s?.dtype !== w.dtype || !fourByte(w.dtype)) {
      throw new StateTransferError(source, where, `it sends shape ${describeShape(s?.shape)} ${String(s?.dtype).slice(0, 20)}, this model has [${w.shape.join(', ')}] ${w.dtype}`);
    }
    modelBytes += numel(w.shape as number[]) * 4;
    return { name: cleanName(spec, where), shape: [...(w.shape as number[])], dtype: w.dtype };
  });
  if (h.modelBytes !== modelBytes) throw new StateTransferError(source, 'model', `it announces ${h.modelBytes} bytes of weights, this model's weights take ${modelBytes}`);

  const slotShapes = [[], ...model.trainableWeights.map((w) => w.shape as number[])];
  const maxSlots = 1 + 3 * model.trainableWeights.length;
  if (h.optimizerSpecs.length > maxSlots) {
    throw new StateTransferError(source, 'optimizer', `it sends ${h.optimizerSpecs.length} optimizer tensors, more than the ${maxSlots} an optimizer of this model's ${model.trainableWeights.length} trainable weights has`);
  }
  let optimizerBytes = 0;
  const optimizerSpecs = h.optimizerSpecs.map((spec: unknown, i): WeightSpec => {
    const s = spec as Partial<WeightSpec> | null;
    const where = `optimizer tensor ${i}`;
    const shape = slotShapes.find((sh) => sameShape(s?.shape, sh));
    if (!shape || typeof s?.dtype !== 'string' || !fourByte(s.dtype)) {
      throw new StateTransferError(source, where, `shape ${describeShape(s?.shape)} ${String(s?.dtype).slice(0, 20)} is neither a scalar nor the shape of one of this model's trainable weights`);
    }
    optimizerBytes += numel(shape) * 4;
    return { name: cleanName(spec, where), shape: [...shape], dtype: s.dtype };
  });
  if (h.optimizerBytes !== optimizerBytes) {
    throw new StateTransferError(source, 'optimizer', `it announces ${h.optimizerBytes} bytes of optimizer state, its tensors take ${optimizerBytes}`);
  }
  let commHook: CommHookStateHeader | null = null;
  if (h.commHook != null) {
    try {
      commHook = readCommHookStateHeader(h.commHook, maxCommHookElements(model));
    } catch (err) {
      if (err instanceof CommHookStateFormatError) throw new StateTransferError(source, 'communication hook state', err.reason);
      throw err;
    }
  }
  return { modelSpecs, modelBytes, optimizerSpecs, optimizerBytes, commHook };
}

function sameShape(a: unknown, b: readonly (number | null)[]): boolean {
  return Array.isArray(a) && a.length === b.length && a.every((d, k) => d === b[k]);
}

function describeShape(shape: unknown): string {
  return Array.isArray(shape) ? `[${shape.slice(0, 8).map((d) => String(d).slice(0, 12)).join(', ')}${shape.length > 8 ? ', ...' : ''}]` : 'none';
}

function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Weights travel as 4-byte words. */
function fourByte(dtype: string): boolean {
  return dtype === 'float32' || dtype === 'int32';
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
  commHook: CommHookState | null;
}

/** Rank 0: loads the latest valid checkpoint of the session (or of `resumeFrom`) into `state`. */
async function restoreFromCheckpoint(state: TrainState, o: RecoveryOptions): Promise<Restored | null> {
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
export async function restoreStatePart(state: TrainState, o: RecoveryOptions & { part: string; step: number }): Promise<Restored> {
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

function resumeToken(o: RecoveryOptions): string {
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

/** The spec name of a hook state's tensor in a checkpoint's optimizer section. */
const hookSpecName = (tensor: string) => `commHook/${tensor}`;

/**
 * A checkpoint's optimizer section with `commHook`'s values after the optimizer's own, and the
 * header that goes in its meta (`meta.commHook`); the section unchanged and no header without one.
 */
export function appendCommHookState(optimizer: TensorBundle, commHook: CommHookState | null | undefined): { optimizer: TensorBundle; header: CommHookStateHeader | null } {
  if (!commHook) return { optimizer, header: null };
  const { header, data } = flattenCommHookState(commHook);
  const bytes = new Uint8Array(optimizer.weightData.byteLength + data.byteLength);
  bytes.set(new Uint8Array(optimizer.weightData), 0);
  bytes.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), optimizer.weightData.byteLength);
  const specs = header.tensors.map((t): WeightSpec => ({ name: hookSpecName(t.name), shape: [t.length], dtype: 'float32' }));
  return { optimizer: { weightSpecs: [...optimizer.weightSpecs, ...specs], weightData: bytes.buffer }, header };
}

/**
 * The reverse of `appendCommHookState`, for a checkpoint's meta and optimizer section: the
 * optimizer's own tensors, and the hook state of `meta.commHook` (null when the checkpoint has
 * none, as every checkpoint saved before hooks were). Throws CheckpointCorruptError('header')
 * when `meta.commHook` does not match the section's last tensors.
 */
export function splitCommHookState(meta: Record<string, unknown>, optimizer: TensorBundle, name?: string): { optimizer: TensorBundle; commHook: CommHookState | null } {
  if (meta.commHook === undefined || meta.commHook === null) return { optimizer, commHook: null };
  const corrupt = (why: string) => new CheckpointCorruptError('header', `its communication hook state ${why}`, name);
  let header: CommHookStateHeader;
  try {
    header = readCommHookStateHeader(meta.commHook);
  } catch (err) {
    if (err instanceof CommHookStateFormatError) throw corrupt(`is unreadable: ${err.reason}`);
    throw err;
  }
  const n = header.tensors.length;
  const specs = optimizer.weightSpecs;
  const own = specs.slice(0, specs.length - n);
  const theirs = specs.slice(specs.length - n);
  if (specs.length < n || !theirs.every((s, i) => s.name === hookSpecName(header.tensors[i]!.name) && s.dtype === 'float32' && s.shape.length === 1 && s.shape[0] === header.tensors[i]!.length)) {
    throw corrupt(`lists ${n} tensors that are not the optimizer section's last ${n}`);
  }
  const hookBytes = 4 * commHookStateElements(header);
  const total = optimizer.weightData.byteLength;
  if (hookBytes > total) throw corrupt(`needs ${hookBytes} bytes, the optimizer section has ${total}`);
  const values = new Float32Array(optimizer.weightData.slice(total - hookBytes));
  return { optimizer: { weightSpecs: own, weightData: optimizer.weightData.slice(0, total - hookBytes) }, commHook: unflattenCommHookState(header, values) };
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
  o: RecoveryOptions & { meta?: Json; part?: string; commHook?: CommHookState | null },
): Promise<{ name: string; bytes: number }> {
  const sd = await state.stateDict();
  const { optimizer, header } = appendCommHookState(sd.optimizer, o.commHook);
  return saveCheckpoint(o.url, o.session, {
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
  }, { token: o.token, ...(o.part === undefined ? {} : { part: o.part }) });
}

function isProgress(p: unknown): p is Progress {
  const ok = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
  return typeof p === 'object' && p !== null && ok((p as Progress).step) && ok((p as Progress).epoch) && ok((p as Progress).position);
}

function isRunRecord(r: unknown): r is RunRecord {
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
