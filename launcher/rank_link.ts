/**
 * The link a rank's page opens (its session, world, job options and token), and what a refused
 * certificate means: apart from the run (rank_run.ts), which only says when a page opens.
 */
import { withToken } from '../src/wire/session_token.ts';
import type { RankPage } from './rank_page.ts';
import type { LaunchOptions } from './run_options.ts';

/** What the link is made of (a part of RankRunSetup, rank_run.ts). */
export interface RankLinkSetup {
  opts: LaunchOptions;
  token: string;
  script: boolean;
  /** The page the ranks open: '/' for a job, the script's own page. */
  entry: string;
  worldSize: number;
  jobParams: Record<string, string>;
}

/** Opens rank page `rp`'s link on the server at `url`. */
export async function openRankLink(rp: RankPage, setup: RankLinkSetup, url: string): Promise<void> {
  const { opts, entry, worldSize, script, jobParams, token } = setup;
  const u = new URL(entry, url);
  const params = new URLSearchParams({
    session: opts.session,
    world: String(worldSize),
    ...(script ? {} : { job: opts.job }),
    ...jobParams,
  });
  if (rp.rank !== undefined && jobParams.min === undefined && !script) params.set('rank', String(rp.rank));
  for (const arg of opts.scriptArgs ?? []) params.append('arg', arg);
  u.search = params.toString();
  try {
    await rp.page.open(withToken(u, token));
  } catch (err) {
    const cert = /net::(ERR_CERT_[A-Z_]+)/.exec((err as Error).message)?.[1];
    if (!cert) throw err;
    // Playwright's message carries the page's link, token included: say what to do instead.
    throw new Error(
      opts.https
        ? `the ranks refused the launcher's own certificate (${cert}): remove certs/ (or CERT_DIR) to make a new one`
        : `the ranks do not trust ${url}'s certificate (${cert}): for a self-signed server give its certificate with --server-cert FILE (its certs/cert.pem)`,
    );
  }
}
