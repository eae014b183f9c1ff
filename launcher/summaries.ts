/** Turns the ranks' results into the launcher's one-line JSON summary, per job. */
export type RankResult = Record<string, unknown> & { rank: number };

export function summarize(job: string, worldSize: number, results: RankResult[]): Record<string, unknown> {
  const ranks = [...results].sort((a, b) => a.rank - b.rank);
  switch (job) {
    case 'rendezvous':
      return { job, worldSize, ranks: ranks.map((r) => ({ rank: r.rank, adapter: r.adapter, webgpu: r.webgpu, ...(r.reason ? { reason: r.reason } : {}) })) };
    default:
      return { job, worldSize, ranks };
  }
}
