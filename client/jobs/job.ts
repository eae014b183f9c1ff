/** What every job gets from the page, and the jobs by name. */
export interface JobContext {
  /** The page's URL parameters (job options). */
  params: URLSearchParams;
  /** The server's origin: the store and signaling relay. */
  serverUrl: string;
  session: string;
  worldSize: number;
  /** Explicit rank from the URL, if any. */
  rank: number | undefined;
  timeoutMs: number;
  /** A line of progress, shown on the page and prefixed with the rank by the launcher. */
  log(line: string): void;
  /** Call once the rank is known. */
  joined(rank: number, worldSize: number): void;
  /** Structured progress for dashboards and the launcher. */
  progress(data: Record<string, unknown>): void;
}

export type Job = (ctx: JobContext) => Promise<Record<string, unknown>>;
