/**
 * Robust aggregation in the run's result: the 'aggregation' events (what the group judged of each
 * rank's contributions) added up on their way to the dashboard, so that the result this rank
 * reports at the end carries them (the launcher's summary prints them: launcher/summaries.ts).
 */
import type { ElasticEvent } from '../../src/parallel/events.ts';
import {
  summarizeContributions,
  tallyContributions,
  type ContributionSummary,
  type ContributionTally,
} from '../../src/parallel/ddp/contributions.ts';

export interface ContributionTracker {
  /** Tallies an 'aggregation' event, then hands every event on. */
  onEvent: (e: ElasticEvent) => void;
  /** `{ aggregation }` for the result: the last round's tally (ranks are renumbered in a new round); empty under the mean. */
  result: () => { aggregation?: ContributionSummary };
}

export function contributionTracker(next: (e: ElasticEvent) => void): ContributionTracker {
  let tally: ContributionTally | null = null;
  return {
    onEvent(e) {
      if (e.type === 'aggregation') {
        const { type: _type, rank: _rank, ...judged } = e;
        tally = tallyContributions(tally, judged);
      }
      next(e);
    },
    result: () => (tally ? { aggregation: summarizeContributions(tally) } : {}),
  };
}
