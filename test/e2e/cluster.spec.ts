/**
 * Several servers behind one address (scripts/cluster.ts: a real Redis, two real server processes
 * on it, a real HAProxy in front): 4 tabs of one session train through the proxy (on one server:
 * the proxy routes a session to one); that server is killed (SIGKILL) mid-run; the tabs reconnect
 * through the proxy to the other server, rejoin, and the run finishes with identical replicas, at
 * most one step redone and every sample once. The cpu backend and a tiny model: the subject is
 * the servers, not the device.
 */
import { launch } from '../../launcher/run.ts';
import { LAST_CALL_MS } from '../../launcher/run_options.ts';
import { newSessionToken } from '../../src/wire/session_token.ts';
import { startCluster, type Cluster } from '../../scripts/cluster.ts';
import { expect, sessionName, test } from './fixtures.ts';

type Summary = {
  identical: boolean;
  stepsRedone: number;
  generations: number;
  samplesSeen: Array<{ samples: number; exactlyOnce: boolean; complete: boolean }>;
};

/** Kills the server that holds `session` once its first round of several ranks formed and trained a moment; resolves with its index. */
async function killHolderMidRun(cluster: Cluster, session: string, afterMs: number): Promise<number> {
  const round = new RegExp(`session "${session}": round \\d+, [2-9] rank`);
  for (const deadline = Date.now() + 60_000; Date.now() < deadline; ) {
    const holder = cluster.servers.findIndex((s) => s.log.some((l) => round.test(l)));
    if (holder >= 0) {
      await new Promise((r) => setTimeout(r, afterMs));
      cluster.servers[holder]!.process.kill('SIGKILL');
      return holder;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`no server formed a round of session "${session}" within 60 s`);
}

test('4 tabs through the proxy; their server killed mid-run: they rejoin on the other and finish, replicas identical, at most one step redone, each sample once', async () => {
  const cluster = await startCluster({ servers: 2, settleMs: LAST_CALL_MS });
  try {
    const session = sessionName('cluster');
    const lines: string[] = [];
    const killed = killHolderMidRun(cluster, session, 1_500);
    const { ok, summary } = await launch({
      nproc: 4,
      job: 'train',
      server: cluster.url,
      session,
      token: newSessionToken(),
      timeoutSec: 120,
      jobParams: { dataset: 'synthetic', trainSize: '4096', batchSize: '32', backend: 'cpu', min: '2', max: '4' },
      log: (l) => lines.push(l),
    });
    const holder = await killed;
    expect(ok, `${JSON.stringify(summary)}\n${lines.slice(-40).join('\n')}`).toBe(true);
    const s = summary as unknown as Summary;
    expect(s.identical).toBe(true);
    expect(s.stepsRedone).toBeLessThanOrEqual(1);
    expect(s.generations).toBeGreaterThanOrEqual(2);
    expect(s.samplesSeen.every((x) => x.exactlyOnce && x.complete)).toBe(true);
    // The run went on on the other server.
    expect(cluster.servers[1 - holder]!.log.some((l) => l.includes(`session "${session}": round`))).toBe(true);
  } finally {
    await cluster.stop();
  }
});
