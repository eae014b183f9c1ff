/**
 * How a new round's ranks are laid out (rendezvous.ts): lost ranks' places are filled from the
 * end, and ranks members asked for are kept. Pure functions over member ids.
 */

/**
 * The places lost ranks left (-1, or a member gone) are taken by the last live ranks, lowest
 * place first, and every other rank keeps its own: the peers a rank's collectives pair it with
 * mostly stay the same pairs of tabs, whose links the next round keeps (renumbering everyone
 * above a hole would pair most tabs anew).
 */
export function fillPlaces(ranks: readonly number[], isMember: (id: number) => boolean): number[] {
  const live = (id: number | undefined) => id !== undefined && id >= 0 && isMember(id);
  const out = [...ranks];
  for (let r = 0; r < out.length; r++) {
    if (live(out[r])) continue;
    while (out.length > r + 1 && !live(out.at(-1))) out.pop();
    if (out.length > r + 1) out[r] = out.pop()!;
    else out.length = r;
  }
  return out;
}

/** Ranks asked for are kept; everyone else fills the free ranks in order. */
export function assignRanks(order: readonly number[], askedRank: (id: number) => number | undefined): number[] {
  const slots = new Array<number | undefined>(order.length);
  const rest: number[] = [];
  for (const id of order) {
    const asked = askedRank(id);
    if (asked !== undefined && asked < slots.length && slots[asked] === undefined) slots[asked] = id;
    else rest.push(id);
  }
  for (let r = 0; r < slots.length; r++) if (slots[r] === undefined) slots[r] = rest.shift();
  return slots as number[];
}

/** The reason a round formed after losses gives: each loss, or the first few and how many more. */
export function describeLosses(why: readonly string[]): string {
  if (why.length <= 3) return why.join('; ');
  return `${why.length} ranks lost: ${why.slice(0, 3).join('; ')}; and ${why.length - 3} more`;
}
