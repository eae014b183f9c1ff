/**
 * A parameter server's side of a round (for runner.ts): answering every worker's pulls and
 * pushes over the group's links until each worker has been told to stop or regroup. An
 * asynchronous server applies each push as it comes (`ParameterServerShard.apply`);
 * CentralStorage waits for every worker's push of the step, averages and applies once
 * (`CentralStorageAccumulator`). Server 0 also hands out the samples and makes the decisions.
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { CentralStorageAccumulator, SyncPushError } from './central_storage.ts';
import type { LeaseBook } from './leases.ts';
import type { ParameterServerShard } from './shard.ts';
import type { PsStrategy } from './types.ts';
import {
  CONTROL,
  NO_COUNTS,
  REQ_END,
  REQ_PUSH,
  VERDICT,
  message,
  payload,
  readRequest,
  writeReply,
  type Control,
  type RequestHead,
} from './wire.ts';

/** What a server's round needs from the run. */
export interface ServingContext {
  pg: ProcessGroup;
  workers: ReadonlyArray<{ workerId: number; rank: number }>;
  shard: ParameterServerShard;
  /** This server's index: server 0 hands out the samples and decides for every worker. */
  index: number;
  strategy: PsStrategy;
  /** The run's book of samples (server 0's is the one that counts). */
  book: LeaseBook;
  /** Whether the user asked to stop (`shouldStop`); the run notes that as its reason. */
  stopRequested(): boolean;
  /** How many tabs wait to join (any: the round regroups to admit them). */
  waiting(): number;
  /** The shard applied an update (for the rates). */
  noteUpdate(): void;
  /** The shard's checkpoint is due: save it in the background. */
  checkpoint(): void;
}

class Deferred<T> {
  resolve!: (v: T) => void;
  readonly promise = new Promise<T>((r) => (this.resolve = r));
}

/** CentralStorage's step being collected: every worker's push, then one decision for all. */
interface CentralStep {
  acc: CentralStorageAccumulator;
  /** Resolves once the step is applied: the workers that pushed earlier are answered then. */
  done: Deferred<void>;
  control: Control | null;
}

/** The next control for a worker (or, without one, for every worker of the step). */
type Decide = (workerId?: number) => Control;

/** Serves every worker of the round until each has been told to stop or regroup. */
export async function serveRound(ctx: ServingContext): Promise<Control> {
  const { workers, shard } = ctx;
  let roundControl: Control = CONTROL.continue;
  const central: CentralStep | null =
    ctx.strategy === 'central'
      ? { acc: new CentralStorageAccumulator(shard, { numWorkers: workers.length }), done: new Deferred<void>(), control: null }
      : null;
  // A host's stop and a regroup hold for every worker of the round; the end of the samples
  // for each worker (one holding an unanswered lease trains it first).
  const decide: Decide = (workerId) => {
    if (roundControl !== CONTROL.continue) return roundControl;
    if (ctx.stopRequested()) roundControl = CONTROL.stop;
    else if (ctx.book.exhausted(shard.version, workerId)) return CONTROL.stop;
    else if (ctx.waiting() > 0) roundControl = CONTROL.regroup;
    return roundControl;
  };
  const results = await Promise.all(workers.map((w, i) => serveWorker(ctx, w, i, central, decide)));
  if (central) central.acc.abandonStep();
  return results.includes(CONTROL.regroup) ? CONTROL.regroup : CONTROL.stop;
}

/** Answers worker `w` (the round's i-th) until it is told to stop or regroup, or says it ended. */
async function serveWorker(
  ctx: ServingContext,
  w: { workerId: number; rank: number },
  i: number,
  central: CentralStep | null,
  decide: Decide,
): Promise<Control> {
  const { pg, shard, index, book, workers } = ctx;
  const buf = message(shard.numel);
  const reply = message(shard.numel);
  for (;;) {
    await pg.recv(buf, w.rank);
    const req = readRequest(buf);
    const grads = payload(buf);
    const { verdict, staleness } =
      req.kind & REQ_PUSH ? await takePush(ctx, w, i, req, grads, central, decide) : { verdict: VERDICT.none, staleness: 0 };
    let control: Control;
    if (req.kind & REQ_END) control = CONTROL.ended;
    else if (index !== 0) control = CONTROL.continue;
    // Every worker of a synchronous step hears the same decision, made once per step.
    else if (central) control = central.control ??= decide();
    else control = decide(w.workerId);
    const lease = index === 0 && control === CONTROL.continue ? book.lease(w.workerId, i, workers.length, shard.version) : null;
    if (index === 0 && control === CONTROL.continue && lease === null) control = decide(w.workerId); // the last lease went to someone else
    const pulled = await shard.pull();
    writeReply(
      reply,
      { verdict, version: pulled.version, control, lease, staleness, counts: index === 0 ? book.samples : NO_COUNTS },
      pulled.values,
    );
    await pg.send(reply, w.rank);
    if (control === CONTROL.ended) return req.endControl === CONTROL.regroup ? CONTROL.regroup : CONTROL.stop;
    if (control !== CONTROL.continue) return control;
  }
}

/** Takes worker `w`'s push: applied, stale, a duplicate or refused (the verdict it is told), and how stale. */
async function takePush(
  ctx: ServingContext,
  w: { workerId: number },
  i: number,
  req: RequestHead,
  grads: Float32Array,
  central: CentralStep | null,
  decide: Decide,
): Promise<{ verdict: number; staleness: number }> {
  if (central) {
    try {
      const r = central.acc.add(i, req.version, grads);
      if (r.status === 'applied') {
        ctx.noteUpdate();
        if (ctx.index === 0) ctx.book.stepApplied(ctx.workers.length);
        if (r.checkpointDue) ctx.checkpoint();
        central.control = decide();
        const done = central.done;
        central.done = new Deferred<void>();
        done.resolve();
      } else await central.done.promise;
      return { verdict: VERDICT.applied, staleness: 0 };
    } catch (err) {
      if (!(err instanceof SyncPushError)) throw err;
      return { verdict: err.reason === 'past-step' ? VERDICT.duplicate : VERDICT.refused, staleness: 0 };
    }
  }
  const r = ctx.shard.apply({ worker: w.workerId, stepId: req.stepId, version: req.version, grads });
  if (r.status === 'applied') ctx.noteUpdate();
  if (ctx.index === 0) ctx.book.pushed(w.workerId, r.status, req.samples);
  if (r.status === 'applied' && r.checkpointDue) ctx.checkpoint();
  return { verdict: VERDICT[r.status], staleness: r.status === 'applied' || r.status === 'stale' ? r.staleness : 0 };
}
