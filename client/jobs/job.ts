import { initProcessGroup, type InitProcessGroupOptions, type ProcessGroup } from '../../src/index.ts';

/** What every job gets from the page, and the jobs by name. */
export interface JobContext {
  /** The page's URL parameters (job options). */
  params: URLSearchParams;
  /** The server's origin: the store and signaling relay. */
  serverUrl: string;
  session: string;
  /** The session's secret (from the link's #token=...). */
  token: string;
  worldSize: number;
  /** Explicit rank from the URL, if any. */
  rank: number | undefined;
  timeoutMs: number;
  /** A line of progress, shown on the page and prefixed with the rank by the launcher. */
  log(line: string): void;
  /** Call once the rank is known. */
  joined(rank: number, worldSize: number): void;
}

export type Job = (ctx: JobContext) => Promise<Record<string, unknown>>;

/** Joins the job's process group: the URL's session, world size and rank, and any tuning it sets. */
export async function joinGroup(ctx: JobContext, defaults: Partial<InitProcessGroupOptions> = {}): Promise<ProcessGroup> {
  const tuning: Partial<InitProcessGroupOptions> = {};
  for (const key of ['maxFrameBytes', 'highWaterMark', 'linkWindowBytes', 'peerTimeoutMs', 'stallTimeoutMs', 'linkTimeoutMs'] as const) {
    const raw = ctx.params.get(key === 'maxFrameBytes' ? 'frameBytes' : key);
    if (raw !== null) tuning[key] = Number(raw);
  }
  const pg = await initProcessGroup({
    url: ctx.serverUrl,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.worldSize,
    rank: ctx.rank,
    timeoutMs: ctx.timeoutMs,
    ...defaults,
    ...tuning,
  });
  ctx.joined(pg.rank, pg.worldSize);
  return pg;
}
