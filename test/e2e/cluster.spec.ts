/**
 * Several servers behind one address (scripts/cluster.ts: a real Redis, two real server processes
 * on it, a real HAProxy in front): 4 tabs of one session train through the proxy (on one server:
 * the proxy routes a session to one); that server is killed (SIGKILL) mid-run while Redis does not
 * answer (SIGSTOP, for a few seconds: the pages say the store is unavailable, then that it answers);
 * the tabs reconnect through the proxy to the other server, rejoin, and the run finishes with identical replicas, at
 * most one step redone and every sample once. Then one session held by both servers at once
 * (signaling/relay.ts): 2 tabs straight to each server, the session's owner killed mid-run and
 * restarted. The cpu backend and a tiny model: the subject is the servers, not the device; its
 * steps held 4 times their compute (heldSteps: a wait, not work), so the kill after the first
 * step lands mid-run.
 */
import { launch } from '../../launcher/run.ts';
import { LAST_CALL_MS } from '../../launcher/run_options.ts';
import { newSessionToken } from '../../src/wire/session_token.ts';
import { startCluster, startClusterServer, type Cluster, type ClusterServer } from '../../scripts/cluster.ts';
import { expect, heldSteps, sessionName, test } from './fixtures.ts';
import { tokenFor } from '../fixtures/session.ts';

type Summary = {
  identical: boolean;
  stepsRedone: number;
  generations: number;
  samplesSeen: Array<{ samples: number; exactlyOnce: boolean; complete: boolean }>;
};

/**
 * Kills the server that holds `session` once its round has trained a step (a rank's "step N/M"
 * line in `lines`: a moment after the round formed was, on a loaded machine, before the first
 * step, and then nothing was mid-run); resolves with its index. With `redisPausedMs`, Redis stops
 * answering (SIGSTOP) at the kill and answers again (SIGCONT) that long after: the tabs' rejoin on
 * the other server meets STORE_UNAVAILABLE.
 */
async function killHolderMidRun(cluster: Cluster, session: string, lines: readonly string[], redisPausedMs = 0): Promise<number> {
  const round = new RegExp(`session "${session}": round \\d+, [2-9] rank`);
  const trained = /\[rank \d+\] epoch \d+ step \d+\//;
  for (const deadline = Date.now() + 60_000; Date.now() < deadline; ) {
    const holder = cluster.servers.findIndex((s) => s.log.some((l) => round.test(l)));
    if (holder >= 0 && lines.some((l) => trained.test(l))) {
      if (redisPausedMs === 0) {
        cluster.servers[holder]!.process.kill('SIGKILL');
        return holder;
      }
      process.kill(cluster.engine.pid, 'SIGSTOP');
      try {
        cluster.servers[holder]!.process.kill('SIGKILL');
        await new Promise((r) => setTimeout(r, redisPausedMs));
      } finally {
        process.kill(cluster.engine.pid, 'SIGCONT');
      }
      return holder;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`no server formed a round of session "${session}" that trained a step within 60 s`);
}

test('4 tabs through the proxy; their server killed mid-run, Redis not answering meanwhile: the pages say the store is unavailable until it answers; they rejoin on the other and finish, replicas identical, at most one step redone, each sample once', async () => {
  const cluster = await startCluster({ servers: 2, settleMs: LAST_CALL_MS });
  try {
    const session = sessionName('cluster');
    const lines: string[] = [];
    // Paused past the tabs' first rejoin on the other server (after 0.5 s): its owner check and their hello each wait 2 s for Redis.
    const killed = killHolderMidRun(cluster, session, lines, 6_000);
    const { ok, summary } = await launch({
      nproc: 4,
      job: 'train',
      server: cluster.url,
      session,
      token: newSessionToken(),
      timeoutSec: 120,
      jobParams: { dataset: 'synthetic', trainSize: '4096', batchSize: '32', backend: 'cpu', min: '2', max: '4', slow: heldSteps(4) },
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
    // The pages said the store was unavailable, then that it answered again (src/c10d/store_unavailable.ts).
    const down = lines.findIndex((l) => l.includes("warn: the session's store is unavailable (store unavailable: "));
    expect(down, lines.join('\n')).toBeGreaterThanOrEqual(0);
    expect(lines.slice(down).some((l) => l.includes("info: the session's store answers again"))).toBe(true);
  } finally {
    await cluster.stop();
  }
});

test('one session on two servers at once: 2 tabs on each, straight to its server; the owner killed mid-run and restarted: the run finishes, replicas identical, at most one step redone', async () => {
  const cluster = await startCluster({ servers: 2, settleMs: LAST_CALL_MS });
  let restarted: ClusterServer | undefined;
  try {
    const session = sessionName('span');
    const lines: string[] = [];
    // Killed once its round of 4 trained a step, then started again on its port: its tabs come back to it.
    const killed = killHolderMidRun(cluster, session, lines).then(async (holder) => {
      const dead = cluster.servers[holder]!;
      // It may have exited already: its 'exit' event would not come again.
      if (dead.process.exitCode === null && dead.process.signalCode === null) await new Promise((r) => dead.process.once('exit', r));
      restarted = await startClusterServer(dead.port, cluster.engine.url, LAST_CALL_MS);
      return holder;
    });
    const node = (nodeRank: number) =>
      launch({
        nproc: 2,
        nnodes: 2,
        nodeRank,
        job: 'train',
        server: cluster.servers[nodeRank]!.url,
        session,
        token: tokenFor(session),
        timeoutSec: 120,
        jobParams: { dataset: 'synthetic', trainSize: '4096', batchSize: '32', backend: 'cpu', min: '2', max: '4', slow: heldSteps(4) },
        log: (l) => lines.push(`node ${nodeRank} ${l}`),
      });
    const outcomes = await Promise.all([node(0), node(1)]);
    const holder = await killed;
    for (const o of outcomes) expect(o.ok, `${JSON.stringify(o.summary)}\n${lines.slice(-40).join('\n')}`).toBe(true);
    const s = outcomes.map((o) => o.summary as unknown as Summary & { weightHashes: string[] });
    // One world of 4: each node's final ranks hold the same weights as the other's.
    const hashes = s.flatMap((x) => x.weightHashes);
    expect(hashes).toHaveLength(4);
    expect(new Set(hashes).size).toBe(1);
    for (const x of s) {
      expect(x.stepsRedone).toBeLessThanOrEqual(1);
      expect(x.generations, lines.slice(-40).join('\n')).toBeGreaterThanOrEqual(2);
    }
    // Each node saw its own ranks' samples: together, every sample of each epoch (once each within a node).
    const epochs = s[0]!.samplesSeen.length;
    for (let e = 0; e < epochs; e++) expect(s[0]!.samplesSeen[e]!.samples + (s[1]!.samplesSeen[e]?.samples ?? 0)).toBe(4096);
    // Both servers held the session: the owner's rounds were formed with tabs relayed from the other.
    expect(cluster.servers[1 - holder]!.log.some((l) => l.includes(`session "${session}": its server went away`))).toBe(true);
  } finally {
    restarted?.process.kill('SIGKILL');
    await cluster.stop();
  }
});
