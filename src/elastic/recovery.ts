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
 * The strategy's hook state (DDP's communication hook's: PowerSGD's Q matrices and error
 * feedback) goes along, opaque to the agent (hook_state.ts): the source sends its hook's name and
 * state with its state dict (the checkpoint's, when the state comes from one), and `recover`
 * hands them back as `Recovered.commHook`; which ranks load it is the caller's choice
 * (runElastic: see its `commHook` option). The transfer itself is state_transfer.ts; the
 * checkpoints, and the hook state's place in them, checkpoints.ts and hook_state.ts.
 */
import { digest48 } from '../wire/hash.ts';
import type { WeightSpec } from '../wire/tfjs_artifacts.ts';
import type { ProcessGroup } from '../c10d/process_group.ts';
import type { TrainState, TrainStateDict } from '../checkpoint/state_dict.ts';
import type { HookState } from './hook_state.ts';
import { withResume, type RunRecord } from './run_record.ts';
import { broadcastState, sendToNeeders, type Shared, type SourceExtras } from './state_transfer.ts';
import { restoreFromCheckpoint, type CheckpointRoutes } from './checkpoints.ts';

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
  commHook: { name: string | null; state: HookState | null };
}

/** A rank's communication hook, as `recover` sees it: its name and, when it keeps state, its state now. */
export interface RecoveryHook {
  name: string;
  state(): HookState | null;
}

export interface RecoveryOptions extends CheckpointRoutes {
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
export async function recover(
  pg: ProcessGroup,
  state: TrainState,
  run: RunRecord,
  claim: StateClaim,
  o: RecoveryOptions,
  hook?: RecoveryHook,
): Promise<Recovered> {
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
  const statuses = Array.from({ length: pg.worldSize }, (_, r) =>
    readStatus(r, gathered.subarray(CLAIM_WORDS * r, CLAIM_WORDS * r + CLAIM_WORDS)),
  );
  const source = chooseSource(statuses, { instance: instanceTag(pg.instance), round: pg.round });
  if (source === undefined) {
    // Nobody has trained yet: a checkpoint, if there is one, else the seed.
    const restored = pg.rank === 0 ? await restoreFromCheckpoint(state, o) : null;
    const flag = await pg.broadcast(Float32Array.of(restored ? 1 : 0), 0);
    if (flag[0] === 0)
      return {
        run: { generations: 0, stepsRedone: 0, resumes: [] },
        source: 'fresh',
        from: 0,
        redone: false,
        transferred: false,
        claimsMs,
        skipped: [],
        commHook: { name: null, state: null },
      };
    const mine = restored
      ? { run: restored.run, note: restored.note, commHook: restored.commHook, commHookName: restored.commHook?.name }
      : null;
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
  return (
    s.live && s.digest !== null && s.digest === src.digest && s.step === src.step && s.instance === src.instance && s.round === src.round
  );
}

/** What a state transfer would make every rank hold: progress, extras, run record, model and optimizer bytes. */
function stateDigest(sd: TrainStateDict, run: RunRecord): [number, number] {
  // Shapes and types, not names: TF.js names layers by a counter of its own in each page.
  const layout = (specs: WeightSpec[]) => specs.map((w) => [w.shape, w.dtype]);
  const text = new TextEncoder().encode(
    JSON.stringify([sd.progress, sd.extras, run, layout(sd.model.weightSpecs), layout(sd.optimizer.weightSpecs)]),
  );
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
