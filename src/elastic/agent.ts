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
import type { RendezvousHandler, Round } from './rendezvous.ts';

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
