/**
 * The contract between the launcher and a user's training script (what torchrun's environment
 * is to a torch script: MASTER_ADDR:MASTER_PORT, WORLD_SIZE, --nnodes MIN:MAX, the script's own
 * arguments). A script is a module whose default export takes a `LaunchContext` and returns its
 * result; the launcher opens one page per rank that runs it and puts rank 0's result, plus the
 * library's own figures for elastic runs, in its summary:
 *
 *   export default async function main(ctx: LaunchContext) { ... return { finalLoss }; }
 */
import type { OfferInfo } from '../datasets/offered.ts';

export interface LaunchContext {
  /** The server (the store and signaling relay), for initProcessGroup or runElastic. */
  url: string;
  session: string;
  /** The session's secret, for initProcessGroup, runElastic and the checkpoint calls. */
  token: string;
  /** How many ranks the launcher opened (--nproc). */
  nproc: number;
  /** The group's size range (--min/--max); both are --nproc for a fixed-size run. */
  min: number;
  max: number;
  /** How long rendezvous and other waits may take. */
  timeoutMs: number;
  /** The script's own arguments: everything after its path on the launcher's command line. */
  argv: string[];
  /** `argv` as options: "--batch-size 32" gives args['batch-size'] === '32'; a flag alone gives 'true'. */
  args: Record<string, string>;
  /**
   * Stragglers asked for with the launcher's `--slow RANK:FACTOR`: rank -> factor (empty: none).
   * The library does not act on it by itself: a script that honours it looks its factor up with
   * the rank of the current round (`pg.rank`; it can change between rounds of an elastic run) and
   * waits with a `Straggler` after each step's compute:
   *   const straggler = new Straggler(slowFactor(ctx.slow, pg.rank));
   *   await straggler.after(timings.compute + timings.readback);
   */
  slow: Record<number, number>;
  /**
   * The host's own model and data, where the launcher was given --model-dir / --data-dir (npm
   * start's --model / --data): what they are (null where none is offered). The script loads them
   * with `loadOfferedModel(ctx)` and `loadOfferedDataset(ctx, inputShape)` (ctx is the request:
   * it carries the server, the session and its token).
   */
  offer: OfferInfo;
  /** The TF.js backend the page set up, and why it is not the one asked for, if it is not. */
  backend: string;
  fallbackReason?: string;
  /** A line of progress (the launcher prefixes it with the rank). */
  log(line: string): void;
}

/** A script's default export. */
export type ScriptMain = (ctx: LaunchContext) => Promise<Record<string, unknown> | undefined> | Promise<void>;

/** "--name value", "--name=value" and lone "--flag" (true); anything else is an error naming it. */
export function parseScriptArgs(argv: string[]): Record<string, string> {
  const args: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith('--') || a === '--') throw new Error(`script argument "${a}" is not an option: use --name value`);
    const eq = a.indexOf('=');
    if (eq > 0) args[a.slice(2, eq)] = a.slice(eq + 1);
    else if (i + 1 < argv.length && !argv[i + 1]!.startsWith('--')) args[a.slice(2)] = argv[++i]!;
    else args[a.slice(2)] = 'true';
  }
  return args;
}

/** An integer argument, or `fallback`; a bad value is an error naming the option. */
export function intArg(args: Record<string, string>, name: string, fallback: number, min = 1): number {
  const raw = args[name];
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < min) throw new Error(`--${name} must be an integer of at least ${min}, got "${raw}"`);
  return n;
}
