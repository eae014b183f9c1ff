/**
 * The link shaping of `--lan` (launcher/lan.ts): each host's rate, from --lan or --lan-rates, and
 * the `tbf` qdisc that holds a link to it (pure; unit-tested in test/lan.test.ts).
 */

/** How fast each host's link is. */
export interface LanOptions {
  /** Every host's rate (Mbit/s, each direction); with `rates`, the rate of hosts beyond the list (ranks opened by --join). */
  rateMbit?: number;
  /** One rate per initial rank (host index 0..nproc-1): a heterogeneous LAN. */
  rates?: number[];
  /** Hosts cannot reach each other, only the server (isolated bridge ports). */
  isolate?: boolean;
  /** Start a TURN relay (Debian's coturn) for the run; the server hands the ranks credentials for it. */
  turn?: boolean;
  /**
   * Every host's packets out are held this long (ms) by a user-space delay line
   * (launcher/lan_delay.py: this kernel has no netem), so a round trip between two hosts takes
   * 2 x delayMs more, and one to the server delayMs more.
   */
  delayMs?: number;
}

export const MAX_DELAY_MS = 1000;

/** `--lan-delay MS`: each host's one-way delay, 1-1000 ms. */
export function parseDelay(value: string | undefined): number {
  const n = value === undefined || value.trim() === '' ? NaN : Number(value);
  if (!Number.isFinite(n) || n < 1 || n > MAX_DELAY_MS) {
    throw new Error(
      `--lan-delay takes each host's one-way delay in ms, 1-${MAX_DELAY_MS} (a round trip between two hosts gets twice it), e.g. --lan-delay 40; got "${value ?? ''}"`,
    );
  }
  return n;
}

export const MIN_RATE_MBIT = 0.1;
export const MAX_RATE_MBIT = 10_000;

/** One rate in Mbit/s, as --lan or an item of --lan-rates gives it. */
export function parseRate(flag: string, value: string | undefined): number {
  const n = value === undefined || value.trim() === '' ? NaN : Number(value);
  if (!Number.isFinite(n) || n < MIN_RATE_MBIT || n > MAX_RATE_MBIT) {
    throw new Error(
      `${flag} takes a link rate in Mbit/s (each direction), ${MIN_RATE_MBIT}-${MAX_RATE_MBIT}, e.g. ${flag} 40; got "${value ?? ''}"`,
    );
  }
  return n;
}

/** `--lan-rates 100,100,20`: one rate per rank, as many as --nproc. */
export function parseRates(value: string | undefined, nproc: number): number[] {
  const items = (value ?? '').split(',');
  const rates = items.map((s, i) => parseRate(`--lan-rates (item ${i + 1})`, s.trim()));
  if (rates.length !== nproc) {
    throw new Error(`--lan-rates gives ${rates.length} rate(s) (${value}) but --nproc is ${nproc}: give one rate per rank`);
  }
  return rates;
}

/** The rate of host `index`: its own from `rates`, else `rateMbit`, else the slowest of `rates`. */
export function rateOf(o: LanOptions, index: number): number {
  const own = o.rates?.[index];
  if (own !== undefined) return own;
  if (o.rateMbit !== undefined) return o.rateMbit;
  if (o.rates && o.rates.length > 0) return Math.min(...o.rates);
  throw new Error('a LAN needs a rate: --lan MBIT or --lan-rates R0,R1,...');
}

/** `tc qdisc add ... tbf` arguments for a rate: the verified recipe (burst 64 KiB, latency 200 ms), burst growing with the rate above ~100 Mbit/s. */
export function tbfArgs(rateMbit: number): string[] {
  const kbit = Math.max(1, Math.round(rateMbit * 1000));
  const burstBytes = Math.max(64 * 1024, Math.ceil((kbit * 1000) / 8 / 200)); // at least 5 ms of traffic
  return ['tbf', 'rate', `${kbit}kbit`, 'burst', String(burstBytes), 'latency', '200ms'];
}
