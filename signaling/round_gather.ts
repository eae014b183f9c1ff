/**
 * Server-attested gathers of a round (`gather` requests): each rank of the running round gives one
 * row under a tag, and once every rank gave its row each of them gets all the rows in rank order.
 * The server places a row at the rank it knows the sender by, so a row says something about rank
 * r only if rank r sent it, and every rank gets the same rows (no member can tell one rank one
 * thing and another rank another). Votes and step figures go this way: riding on a sum all-reduce
 * they could be written by any member (any member can add into any row).
 *
 * Bounded: each rank may have rows in at most MAX_OPEN_GATHERS open gathers (so at most that many
 * times the world size are open; a rank that opens tags nobody else gives fills only its own
 * budget, never the others'), one row per rank and tag, MAX_GATHER_VALUES values per row
 * (validated on the wire); a new round or a lost rank fails the open gathers at once, and each
 * waiting rank times out after its own `timeoutMs`, naming the ranks missing.
 */
import { ErrorCode, MAX_OPEN_GATHERS } from '../src/wire/protocol.ts';
import { StoreRefusal } from './store.ts';

/** How many completed tags a round remembers. */
const COMPLETED_KEPT = 256;

interface Waiter {
  resolve(rows: number[][]): void;
  reject(err: Error): void;
  timer: ReturnType<typeof setTimeout>;
}

interface OpenGather {
  rows: Array<number[] | undefined>;
  waiters: Waiter[];
}

export class RoundGathers {
  private round = 0;
  private readonly open = new Map<string, OpenGather>();
  /** Tags completed lately in this round (a late second row for one is refused, not a new gather). */
  private readonly completed = new Set<string>();

  constructor(private readonly sessionName: string) {}

  /** Round `round` begins (or the rendezvous ended): the open gathers of the last one can never complete. */
  reset(round: number, why: string): void {
    this.abort(why);
    this.completed.clear();
    this.round = round;
  }

  /** Fails every open gather (a rank of the round left): its row will never come. */
  abort(why: string): void {
    for (const [tag, g] of this.open) {
      const err = new StoreRefusal(
        ErrorCode.GATHER_ABORTED,
        `the gather "${tag}" of round ${this.round} of session "${this.sessionName}" cannot complete: ${why}`,
        { round: this.round, tag },
        false,
      );
      for (const w of g.waiters) {
        clearTimeout(w.timer);
        w.reject(err);
      }
    }
    this.open.clear();
  }

  /** Rank `rank` of a round of `worldSize` ranks gives its row under `tag`; resolves with every rank's row. */
  give(rank: number, worldSize: number, tag: string, values: number[], timeoutMs: number): Promise<number[][]> {
    let g = this.open.get(tag);
    if (!g && this.completed.has(tag)) {
      throw new StoreRefusal(
        ErrorCode.BAD_MESSAGE,
        `rank ${rank} gave a row to gather "${tag}" of round ${this.round}, which every rank completed already: one row per rank`,
        { round: this.round, tag, rank },
      );
    }
    const mine = [...this.open.values()].filter((o) => o.rows[rank] !== undefined).length;
    if (mine >= MAX_OPEN_GATHERS) {
      throw new StoreRefusal(
        ErrorCode.BAD_MESSAGE,
        `rank ${rank} has rows in ${mine} gathers of round ${this.round} that other ranks have not completed, the most one rank may (MAX_OPEN_GATHERS): "${tag}" waits until one completes`,
        { round: this.round, tag, rank },
      );
    }
    if (!g) {
      g = { rows: new Array<number[] | undefined>(worldSize).fill(undefined), waiters: [] };
      this.open.set(tag, g);
    }
    if (g.rows[rank] !== undefined) {
      throw new StoreRefusal(
        ErrorCode.BAD_MESSAGE,
        `rank ${rank} gave its row of gather "${tag}" in round ${this.round} already: one row per rank`,
        { round: this.round, tag, rank },
      );
    }
    g.rows[rank] = values;
    const gather = g;
    const answer = new Promise<number[][]>((resolve, reject) => {
      const timer = setTimeout(() => {
        gather.waiters = gather.waiters.filter((w) => w.timer !== timer);
        const missing = gather.rows.flatMap((r, i) => (r === undefined ? [i] : []));
        reject(
          new StoreRefusal(
            ErrorCode.TIMEOUT,
            `waited ${timeoutMs} ms for rank(s) ${missing.join(', ')} of round ${this.round} to give their row of gather "${tag}"`,
            { round: this.round, tag, ranks: missing, timeoutMs },
            false,
          ),
        );
      }, timeoutMs);
      gather.waiters.push({ resolve, reject, timer });
    });
    if (g.rows.every((r) => r !== undefined)) {
      this.open.delete(tag);
      this.completed.add(tag);
      if (this.completed.size > COMPLETED_KEPT) this.completed.delete(this.completed.values().next().value!);
      const rows = g.rows as number[][];
      for (const w of g.waiters) {
        clearTimeout(w.timer);
        w.resolve(rows);
      }
    }
    return answer;
  }
}
