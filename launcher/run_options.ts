/**
 * What a launch is given and gives back (the options, the faults to inject, the outcome), and
 * the words the launcher uses for them.
 */
import type { ServerOptions } from '../signaling/server.ts';
import type { BrowserPlan, RankBrowser } from './rank_browsers.ts';
import type { LanOptions } from './lan.ts';
import type { RankResult } from './summary_fields.ts';

/**
 * The rank a fault hits: its number, or a browser (--browser, --browsers): the lowest rank
 * running in that browser when the fault comes. An elastic run numbers its ranks in the order
 * they arrive, so in a mixed fleet a rank's number does not say which browser holds it.
 */
export type FaultTarget = number | RankBrowser;

/** "rank 1", or "the firefox rank". */
export function describeTarget(t: FaultTarget): string {
  return typeof t === 'number' ? `rank ${t}` : `the ${t} rank`;
}

/** A fault to inject once the run reaches `step` (as reported by any rank). */
export type Fault =
  | { kind: 'kill'; rank: FaultTarget; step: number }
  | { kind: 'freeze'; rank: FaultTarget; step: number }
  /** Put the rank's tab in the background (--tabs only). */
  | { kind: 'hide'; rank: number; step: number }
  /** Destroy the rank's WebGPU device, as a driver reset loses it: the rank rebuilds and rejoins. */
  | { kind: 'lose-device'; rank: FaultTarget; step: number }
  | { kind: 'join'; count: number; step: number }
  | { kind: 'restart-server'; step: number };

export interface LaunchOptions {
  nproc: number;
  /** A built-in job of the page, or the path of a user script (a module whose default export trains). */
  job: string;
  /** The script's own arguments (for a script). */
  scriptArgs?: string[];
  /** Use this server instead of starting one. */
  server?: string;
  /**
   * The launcher's own server serves https and wss with the self-signed certificate kept in
   * certs/ (made if needed), and the ranks' Chromium trusts exactly that certificate.
   */
  https?: boolean;
  /** The certificate (PEM) of `server`, for the ranks to trust (a self-signed server's certs/cert.pem). */
  serverCert?: string;
  session: string;
  /** The session's secret; the pages get it in their links' fragments. Default: a new one. */
  token?: string;
  timeoutSec: number;
  /** Passed to the job as URL parameters (min, max and backend for a script). */
  jobParams: Record<string, string>;
  faults?: Fault[];
  /** --churn SEC: from the first step, every SEC seconds a tab is killed, joins, is frozen, joins, ... (see churn.ts). */
  churnEverySec?: number;
  /** Options for the server the launcher starts. */
  serverOptions?: ServerOptions;
  /** Run the ranks as tabs of a headful Chromium under Xvfb, with default background throttling. */
  tabs?: boolean;
  /** With `tabs`: start intensive throttling after this many seconds hidden (see TabsOptions). */
  intensiveThrottlingAfterSec?: number;
  /** Machines in the world (torchrun's --nnodes), each running a launcher with `nproc` ranks. Default 1. */
  nnodes?: number;
  /** This machine's place among them, 0..nnodes-1 (torchrun's --node-rank). Default 0. */
  nodeRank?: number;
  /**
   * A LAN in a box (launcher/lan.ts): every rank a Chromium of its own in its own network
   * namespace on a bridge, its link shaped to its rate; the server listens on the bridge. Root only.
   * `isolate`: the ranks cannot reach each other; `turn`: a TURN relay (coturn) for the run.
   */
  lan?: LanOptions;
  /** More Chromium flags for each rank's browser (--lan). */
  rankChromiumArgs?: string[];
  /**
   * The browser of each rank (--browser, --browsers): Chromium or Firefox, and of pages opened by
   * --join. Default: every rank a headless page of one Chromium.
   */
  browsers?: BrowserPlan;
  /** Where rank-prefixed lines go. Default: console.log. */
  log?: (line: string) => void;
}

export interface LaunchOutcome {
  ok: boolean;
  summary: Record<string, unknown>;
  /** Each finishing rank's own result, as the page returned it. */
  results: RankResult[];
}

/** How long the launcher's server waits for more tabs once the minimum is in, before the first round (`--last-call`). */
export const LAST_CALL_MS = 5_000;

export function describeFault(f: Fault): string {
  switch (f.kind) {
    case 'kill':
      return `kill ${describeTarget(f.rank)} at step ${f.step}`;
    case 'freeze':
      return `freeze ${describeTarget(f.rank)} at step ${f.step}`;
    case 'hide':
      return `hide rank ${f.rank}'s tab at step ${f.step}`;
    case 'lose-device':
      return `lose ${describeTarget(f.rank)}'s WebGPU device at step ${f.step}`;
    case 'join':
      return `open ${f.count} more rank(s) at step ${f.step}`;
    case 'restart-server':
      return `restart the server at step ${f.step}`;
  }
}

/** A job name that is a file path: a user script. */
export function isScript(job: string): boolean {
  return /\.(ts|js|mts|mjs)$/.test(job);
}

/** `text` with control characters (escape sequences, line breaks) shown as \xNN; tabs kept. */
export function printable(text: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: finding control characters is this function's purpose (they are shown escaped)
  return text.replace(/[\u0000-\u0008\u000a-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}
