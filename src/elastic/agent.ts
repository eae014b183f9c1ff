/**
 * The elastic agent (torch.distributed.elastic's SimpleElasticAgent): the one round loop that
 * every strategy runs in. It asks the rendezvous handler for a round, has the strategy train in
 * it, and then either closes the rendezvous (the run is over: torch's set_closed at shutdown,
 * so that a tab waiting to be admitted, or arriving now, learns at once that there is nothing
 * left to join), admits the members waiting (every rank past the round's last collective, then
 * a regroup), or, when the round failed, lets the strategy report it and forms a new round:
 * of the same members when every member is still here (`roundFailed`), as torch's agents
 * re-rendezvous after a worker group fails.
 *
 * Strategies (DDP in `runner.ts`, pipelines, parameter servers) say only what a round is and
 * what a failure means for them; the rounds themselves are this loop's.
 */
import type { ProcessGroupEvent } from '../c10d/process_group.ts';
import type { Json } from '../checkpoint/state_dict.ts';
import type { RendezvousEvent, RendezvousHandler, Round } from '../c10d/rendezvous.ts';

/**
 * What to train and for how long: the options every strategy's run takes alike (DDP's
 * `runElastic`, `runPipeline`, `runParameterServer`). The order is DistributedSampler's.
 */
export interface ScheduleOptions {
  datasetLength: number;
  /** Samples per step: per rank (DDP), per pipeline replica, per worker (parameter servers). */
  batchSize: number;
  /** Train this many epochs (default 1), unless `steps` is given. */
  epochs?: number;
  /** Stop after this many steps in all, whatever the epochs. */
  steps?: number | null;
  /** DistributedSampler's options, the same on every rank. */
  shuffle?: boolean;
  seed?: number;
  dropLast?: boolean;
}

/** The hooks every strategy's run takes alike; `E` is the strategy's event type. */
export interface RunHooks<E> {
  /** Asked once a step: true once this rank wants the run to stop. */
  shouldStop?(): boolean;
  /** Every event of the run. */
  onEvent?(e: E): void;
  /** Every event of the rendezvous handler as it comes (e.g. 'spectating', the host's 'control'). */
  onRendezvous?(e: RendezvousEvent): void;
  /** Kept in each checkpoint's metadata (the job's configuration, say). */
  checkpointMeta?: Json;
}

/**
 * The hooks of the strategies whose ranks step together (DDP, pipelines): `C` is what a round
 * gives its hooks. The hooks may run collectives: every rank calls them at the same step.
 */
export interface LockstepHooks<C, M> {
  /**
   * Whose `shouldStop` stops the run: 'any' rank's (default), or 'all' ranks' at the same step.
   * 'all' suits a stop every rank learns of from a trusted source (the session's host, through
   * the server): no single member can stop the run by voting alone.
   */
  stopVote?: 'any' | 'all';
  /** A round starts training (its state shared and loaded). */
  onRound?(ctx: C): void | Promise<void>;
  /**
   * After each committed step and its vote. Where votes ride on the next step, the step before a
   * fault has one when its vote came back before the group broke, and none when it did not: its
   * ranks' metrics never met.
   */
  onStep?(ctx: C & { metrics: M[] }): void | Promise<void>;
  /** After an epoch's last step. */
  onEpochEnd?(ctx: C): void | Promise<void>;
}

/** The schedule's DistributedSampler settings with torch's defaults (shuffled, seed 0, the last batch kept). */
export function samplerSettings(o: ScheduleOptions): { datasetLength: number; shuffle: boolean; seed: number; dropLast: boolean } {
  return { datasetLength: o.datasetLength, shuffle: o.shuffle ?? true, seed: o.seed ?? 0, dropLast: o.dropLast ?? false };
}

/** Refuses a schedule no run can use, saying which option and what was given. */
export function checkSchedule(o: ScheduleOptions & { stopVote?: unknown }): void {
  const positiveInt = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v > 0;
  if (!(typeof o.datasetLength === 'number' && Number.isSafeInteger(o.datasetLength) && o.datasetLength >= 0)) {
    throw new RangeError(`datasetLength must be a non-negative integer, got ${o.datasetLength}`);
  }
  if (!positiveInt(o.batchSize)) throw new RangeError(`batchSize must be a positive integer, got ${o.batchSize}`);
  if (o.epochs !== undefined && !positiveInt(o.epochs)) throw new RangeError(`epochs must be a positive integer, got ${o.epochs}`);
  if (o.steps != null && !positiveInt(o.steps)) throw new RangeError(`steps must be a positive integer, got ${o.steps}`);
  if (o.stopVote !== undefined && o.stopVote !== 'any' && o.stopVote !== 'all')
    throw new RangeError(`stopVote must be 'any' or 'all', got ${String(o.stopVote)}`);
}

/** What a round that did not end the run asks for: admit the members waiting. */
export const REGROUP: unique symbol = Symbol('regroup');

export interface ElasticStrategy<R> {
  /**
   * Trains in `round` until the run is over (its result, once every rank is through the run's
   * last collective) or members wait to be admitted (REGROUP). `again`: the same round once
   * more, after a regroup that admitted nobody (the members who waited left): its state is in
   * place already.
   */
  round(round: Round, again: boolean): Promise<R | typeof REGROUP>;
  /**
   * The round failed with `err`: report it, and resolve 'retry' for a new round (of the same
   * members, if nobody left), or 'rejoined' when this rank left the group and joined it again
   * itself (a lost device). Throw to end the run (an error no new round can help).
   */
  failed(round: Round, err: unknown): Promise<'retry' | 'rejoined'>;
  /** Before this rank asks for a regroup. */
  regrouping?(round: Round): void;
  /** A peer of the round was lost (its link closed, or it went silent). */
  peerLost?(round: Round, e: Extract<ProcessGroupEvent, { type: 'peer-lost' }>): void;
}

/** Runs `strategy` round after round until it returns the run's result; rejects with what ended the run. */
export async function runAgent<R>(handler: RendezvousHandler, strategy: ElasticStrategy<R>): Promise<R> {
  let round = await handler.nextRendezvous(0);
  let again = false;
  for (;;) {
    const current = round;
    const stopWatching = current.pg.on((e) => {
      if (e.type === 'peer-lost') strategy.peerLost?.(current, e);
    });
    try {
      const outcome = await strategy.round(current, again);
      if (outcome !== REGROUP) {
        // Every rank asks (the first closes it); should the server be away, nobody can be waiting on it either.
        await handler.closeRendezvous().catch(() => {});
        return outcome;
      }
      // Everyone past the round's last collective first, so the new round interrupts nobody.
      strategy.regrouping?.(current);
      await current.pg.barrier();
      again = (await handler.regroup(current)) === current.round;
      if (!again) round = await handler.nextRendezvous(current.id);
    } catch (err) {
      again = false;
      stopWatching();
      if ((await strategy.failed(current, err)) === 'retry') void handler.roundFailed(current);
      round = await handler.nextRendezvous(current.id);
    } finally {
      stopWatching();
    }
  }
}
