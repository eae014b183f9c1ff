/**
 * The dashboard as a person reads it, replayed through its pure reducer (client/ui/dashboard_state.ts):
 * phases and status lines, waiting counts, progress and ETA, per-rank averages, lost ranks, stop,
 * done, fail, epochs and the log. No DOM: every figure asserted is what the views would draw.
 */
import { describe, expect, it } from 'vitest';
import type { RankStepMetrics, TrainConfig, TrainEvent } from '../client/train/events.ts';
import { MAX_LOG, initialDashboardState, reduceDashboard, type DashboardEvent, type DashboardState } from '../client/ui/dashboard_state.ts';
import { statCards } from '../client/ui/dashboard_cards.ts';
import { CONFIRM, controls, downloadBaseName } from '../client/ui/dashboard_controls.ts';
import { facts } from '../client/ui/dashboard_facts.ts';
import { describeCommHook, describeJob } from '../client/ui/dashboard_job.ts';
import { commFigures, rankAverages } from '../client/ui/dashboard_perf.ts';
import { pipelinePanel, timelineModel } from '../client/ui/dashboard_pipeline.ts';
import { progressFigures, runSeconds } from '../client/ui/dashboard_progress.ts';
import { evalSeconds, evalsLeft, predictedEvalSeconds, stepSeconds, timeLeft } from '../client/ui/time_left.ts';
import { faultHistoryLines, faultSummary, runReport, summaryEntries } from '../client/ui/dashboard_report.ts';
import { pathWords, ringModel } from '../client/ui/dashboard_ring.ts';
import { displayPhase, phaseLabel, statusText } from '../client/ui/dashboard_status.ts';
import { pathLabel } from '../client/ui/ring_view.ts';

const T0 = Date.UTC(2024, 0, 1, 12, 0, 0);

function config(over: Partial<TrainConfig> = {}): TrainConfig {
  return {
    model: 'mlp',
    hidden: null,
    dataset: 'synthetic',
    local: null,
    context: null,
    streamData: 'auto',
    batchSize: 64,
    lr: 0.003,
    optimizer: 'adam',
    epochs: 2,
    steps: null,
    timeLimit: null,
    trainSize: 0,
    testSize: 0,
    seed: 0,
    shuffle: true,
    balance: true,
    voteWithGradients: true,
    backend: 'webgpu',
    min: 3,
    max: 3,
    checkpointEvery: 0,
    evalEvery: 100,
    firstSample: 0,
    resumeFrom: null,
    pp: 1,
    dp: 1,
    microBatches: 1,
    schedule: 'gpipe',
    activationDtype: 'float32',
    splitPoints: null,
    strategy: 'ddp',
    ps: 1,
    maxStaleness: null,
    stalenessLr: false,
    slow: null,
    commHook: { kind: 'none' },
    devices: 1,
    linkWindowBytes: null,
    aggregation: { kind: 'mean' },
    attack: null,
    ...over,
  };
}

function metrics(rank: number, over: Partial<RankStepMetrics> = {}): RankStepMetrics {
  return { rank, loss: 0.5, accuracy: 0.8, samplesPerSec: 100, breakdownMs: { compute: 10, readback: 1, allreduce: 5, apply: 2 }, ...over };
}

function step(
  n: number,
  opts: { epoch?: number; total?: number; elapsed?: number; ranks?: number[] | RankStepMetrics[] } = {},
): TrainEvent {
  const ranks = (opts.ranks ?? [0, 1, 2]).map((r) => (typeof r === 'number' ? metrics(r) : r));
  return { type: 'step', epoch: opts.epoch ?? 0, step: n, totalSteps: opts.total ?? 32, ranks, elapsedSec: opts.elapsed ?? n };
}

/** Replays `events` one second apart, starting one second after the page opened. */
function replay(events: DashboardEvent[], from: DashboardState = initialDashboardState({ session: 's', at: T0 })): DashboardState {
  let s = from;
  let at = (s.log[0]?.at ?? T0) + 1000;
  for (const event of events) {
    s = reduceDashboard(s, { at, event });
    at += 1000;
  }
  return s;
}

const joined = (rank: number, worldSize = 3): TrainEvent => ({
  type: 'joined',
  rank,
  worldSize,
  backend: 'webgpu',
  adapter: 'SwiftShader',
});
const waiting = (arrived: number, min = 3, max = 3, paused = false): TrainEvent => ({ type: 'waiting', arrived, min, max, paused });

/** A fixed-size run of 3 that has started training (this tab is rank 1). */
function training(over: Partial<TrainConfig> = {}): DashboardState {
  return replay([
    { type: 'config', config: config(over) },
    waiting(3),
    joined(1),
    { type: 'shard', epoch: 0, samples: 512, datasetSize: 1536, stepsPerEpoch: 16 },
    step(1),
    step(2),
    step(3),
    step(4),
    step(5),
  ]);
}

describe('phases and the status line', () => {
  it("says the session's store is unavailable while it is (logged once each way), and goes back to training once it answers", () => {
    const down = replay([{ type: 'store', unavailable: "store unavailable: the server's shared store does not answer" }], training());
    expect(statusText(down)).toBe("The session's store is unavailable (its server's Redis does not answer); retrying…");
    expect(down.log[0]).toMatchObject({
      level: 'warn',
      message: expect.stringContaining("The session's store is unavailable: store unavailable"),
    });
    const up = replay([step(6), { type: 'store', unavailable: null }], down);
    expect(statusText(up)).toBe(statusText(training()));
    expect(up.log[0]).toMatchObject({ level: 'info', message: "The session's store answers again." });
  });

  it('starts connecting, and the log says which session was opened', () => {
    const s = initialDashboardState({ session: 'my-run', at: T0 });
    expect(s.phase).toBe('connecting');
    expect(statusText(s)).toBe('Connecting to the server…');
    expect(s.log).toEqual([{ id: 0, at: T0, level: 'info', message: 'Opened session “my-run”.' }]);
  });

  it('while waiting it counts the tabs the session still needs', () => {
    const s = replay([{ type: 'config', config: config() }, waiting(1)]);
    expect(s.phase).toBe('waiting');
    expect(phaseLabel(s)).toBe('Waiting for tabs');
    expect(statusText(s)).toBe('Waiting for 2 more tabs (1 of 3 here). Share the link below.');
    const two = replay([waiting(2)], s);
    expect(statusText(two)).toBe('Waiting for 1 more tab (2 of 3 here). Share the link below.');
    expect(two.log[0]!.message).toBe('2 of 3 tabs in the session.');
  });

  it('an elastic session waits for its minimum, then starts saying how many more can join', () => {
    const one = replay([{ type: 'config', config: config({ min: 2, max: 4 }) }, waiting(1, 2, 4)]);
    expect(statusText(one)).toBe('Waiting for 1 more tab (1 here; training starts with 2, up to 4 can join). Share the link below.');
    const two = replay([waiting(2, 2, 4)], one);
    expect(two.phase).toBe('starting');
    expect(statusText(two)).toBe('2 tabs joined, enough to start (up to 4 can train together). Connecting the ring and loading data…');
  });

  it('goes waiting, starting, training as the tabs arrive, the group forms and the first step completes', () => {
    const full = replay([{ type: 'config', config: config() }, waiting(1), waiting(3)]);
    expect(full.phase).toBe('starting');
    expect(statusText(full)).toBe('All 3 tabs joined. Connecting the ring and loading data…');
    const grouped = replay([joined(1)], full);
    expect(grouped.phase).toBe('starting');
    expect(facts(grouped).rank).toEqual({ text: 'rank 1 · world size 3', rank: 1 });
    const stepped = replay([step(1)], grouped);
    expect(stepped.phase).toBe('training');
    expect(statusText(stepped)).toBe('Training (epoch 1 of 2) on 3 ranks.');
    expect(stepped.log[0]!.message).toBe('Training started: first step done with 3 ranks.');
  });

  it('a group that falls below its minimum is paused until a new group forms', () => {
    const s = training({ min: 2, max: 3 });
    const paused = replay([waiting(1, 2, 3, true)], s);
    expect(paused.phase).toBe('waiting');
    expect(phaseLabel(paused)).toBe('Paused');
    expect(statusText(paused)).toBe(
      'Training is paused at step 5: only 1 tab is left, below the minimum of 2. It resumes when 1 more tab joins. Share the link below.',
    );
    expect(paused.log[0]).toMatchObject({
      level: 'warn',
      message: 'Paused: only 1 tab is left, below the minimum of 2. Training resumes when more tabs join.',
    });
    const regrouped = replay([waiting(2, 2, 3), joined(0, 2)], paused);
    expect(regrouped.phase).toBe('starting');
    expect(regrouped.self).toBe(0);
    expect(regrouped.worldSize).toBe(2);
    expect(replay([step(6, { ranks: [0, 1] })], regrouped).phase).toBe('training');
  });

  it('tabs arriving during training do not interrupt it', () => {
    const s = replay([waiting(4, 2, 4)], training({ min: 2, max: 4 }));
    expect(s.phase).toBe('training');
    expect(s.waiting).toEqual({ arrived: 4, min: 2, max: 4, paused: false });
  });

  it('done: the status gives steps, time and the final accuracy, and the model can be downloaded', () => {
    const s = replay(
      [step(32, { epoch: 1, elapsed: 65 }), { type: 'done', summary: { testAccuracy: 0.9312, testLoss: 0.22, steps: 32 } }],
      training(),
    );
    expect(s.phase).toBe('done');
    expect(statusText(s)).toBe('Done. 32 steps in 1 min 05 s. Final test accuracy 93.1%. The model can be downloaded.');
    expect(controls(s)).toMatchObject({ stop: { visible: true, disabled: true, label: 'Training finished' }, downloadEnabled: true });
    expect(progressFigures(s)).toMatchObject({
      step: 32,
      total: 32,
      value: 32,
      max: 32,
      done: true,
      text: 'Epoch 2 of 2 · step 32 / 32 (100%) · finished in 1 min 05 s',
    });
    expect(statCards(s).test).toEqual({ value: '93.1%', sub: 'final, loss 0.22' });
  });

  it('stop: requested here, stopped by this tab, and after done it still says who stopped it', () => {
    const s = training();
    expect(controls(s).stop).toEqual({ visible: true, disabled: false, label: 'Stop training for everyone' });
    const requested = replay([{ type: 'stop-requested' }], s);
    expect(controls(requested).stop).toEqual({ visible: true, disabled: true, label: 'Stopping…' });
    expect(requested.log[0]!.message).toBe('Stop requested by this tab.');
    expect(requested.phase).toBe('training');
    const stopped = replay([{ type: 'stopped', by: 1, atStep: 6 }], requested);
    expect(stopped.phase).toBe('stopped');
    // The weights are final at the stop: they can be saved at once, while the evaluation runs.
    expect(statusText(stopped)).toBe('Stopped by rank 1 (this tab) at step 6. The model trained so far can be downloaded now.');
    expect(controls(stopped)).toMatchObject({ stop: { disabled: true, label: 'Stopped' }, downloadEnabled: true });
    const evaluating = replay([{ type: 'evaluating', step: 6, done: 150, total: 500 }], stopped);
    expect(statusText(evaluating)).toBe(
      'Stopped by rank 1 (this tab) at step 6. The model trained so far can be downloaded now. Evaluating on the test set… 30%.',
    );
    expect(controls(evaluating).skipEval).toEqual({ visible: true, disabled: false, label: 'Skip the evaluation' });
    const done = replay([{ type: 'done', summary: { testAccuracy: 0.9, stoppedBy: 1 } }], stopped);
    expect(done.phase).toBe('stopped');
    expect(statusText(done)).toBe(
      'Stopped by rank 1 (this tab) at step 6. Test accuracy 90.0%. The model trained so far can be downloaded.',
    );
    expect(controls(done)).toMatchObject({ stop: { disabled: true, label: 'Stopped' }, downloadEnabled: true });
    expect(done.log[0]!.message).toBe(
      'Finished after the stop. Training: 5 steps · epoch 1 of 2 · 3 tabs at the end, Total time: 5 s, Final test accuracy: 90.00%, Faults survived: none',
    );
    // Training stopped after the last step's 5 s; a total that also holds the evaluation says so.
    const evaluated = replay([{ type: 'done', summary: { testAccuracy: 0.9, stoppedBy: 1, seconds: 16 } }], evaluating);
    expect(progressFigures(evaluating).text).toContain('stopped after 5 s');
    expect(statCards(evaluating).time).toEqual({ value: '5 s', sub: 'until stopped' });
    expect(progressFigures(evaluated).text).toContain('stopped after 5 s');
    expect(statCards(evaluated).time).toEqual({ value: '16 s', sub: 'total time; stopped after 5 s, then evaluated' });
  });

  it('the evaluation after the run: downloads at once, its progress, and the host skips it on every tab', () => {
    const s = replay([{ type: 'role', host: true, hasHost: true, spectator: false }], training());
    expect(controls(s)).toMatchObject({ skipEval: { visible: false }, downloadEnabled: false });
    const evaluating = replay([{ type: 'evaluating', step: 12, done: 0, total: 400 }], s);
    expect(phaseLabel(evaluating)).toBe('Evaluating');
    expect(statusText(evaluating)).toBe('Training finished at step 12. Evaluating on the test set… 0%. The model can be downloaded now.');
    expect(controls(evaluating)).toMatchObject({ skipEval: { visible: true, disabled: false }, downloadEnabled: true });
    const asked = replay([{ type: 'skip-eval-requested' }], evaluating);
    expect(controls(asked).skipEval).toEqual({ visible: true, disabled: true, label: 'Skipping the evaluation…' });
    // Every tab hears the host's skip as a 'stop' during the evaluation: not as a second stop of the training.
    const heard = replay([{ type: 'control', action: 'stop' }], evaluating);
    expect(heard.stoppedByHost).toBe(false);
    expect(controls(heard).skipEval.disabled).toBe(true);
    const skipped = replay(
      [
        { type: 'evaluating', step: 12, done: 40, total: 400, skipped: true },
        { type: 'done', summary: { testAccuracy: null, evaluationSkipped: true } },
      ],
      asked,
    );
    expect(statusText(skipped)).toMatch(/^Done\. .* The evaluation was skipped\. The model can be downloaded\.$/);
    expect(controls(skipped)).toMatchObject({ skipEval: { visible: false }, downloadEnabled: true });
    // A spectator's replica is not the run's: watching the evaluation enables nothing.
    const watching = replay(
      [
        { type: 'role', host: false, hasHost: true, spectator: true },
        { type: 'evaluating', step: 12, done: 0, total: 400 },
      ],
      initialDashboardState({ session: 'x', at: 0 }),
    );
    expect(controls(watching).downloadEnabled).toBe(false);
  });

  it('a tab that watched a run to its good end says so, not that training failed', () => {
    const watching = replay([
      { type: 'config', config: config() },
      waiting(3),
      { type: 'role', host: false, hasHost: true, spectator: true },
      step(50),
    ]);
    const s = replay([{ type: 'watched-end' }], watching);
    expect(s.phase).toBe('done');
    expect(statusText(s)).toBe(
      'The run finished before this tab got a rank, after 50 steps: it trained without this tab. To train, ask the host for a new session.',
    );
    expect(s.log[0]).toMatchObject({ level: 'info', message: 'The run finished before this tab got a rank: it trained without this tab.' });
    expect(s.log.some((e) => e.level === 'error')).toBe(false);
  });

  it('a rank whose last round failed as the others finished the run says the run ended without it, not Done, and not failed', () => {
    const s = replay([{ type: 'watched-end', rank: 1 }], training());
    expect(s.phase).toBe('done');
    expect(statusText(s)).toBe(
      "The run finished without this tab: its last round failed here (rank 1) while the other tabs finished it, after 5 steps. The final model is theirs; this tab's replica, from its last committed step, can be downloaded.",
    );
    expect(s.log[0]).toMatchObject({ level: 'warn' });
    expect(s.log.some((e) => e.level === 'error')).toBe(false);
  });

  it('fail: the run is failed, keeps its lost ranks, and later events do not revive it', () => {
    const lost = replay([{ type: 'rank-lost', rank: 2, reason: 'its tab closed' }], training());
    const failed = replay([{ type: 'failed', title: 'Rank 2 was lost', detail: 'peer 2 closed', action: 'Start a new session.' }], lost);
    expect(failed.phase).toBe('failed');
    expect(statusText(failed)).toBe('Training failed at step 5: Rank 2 was lost.');
    expect(failed.error).toEqual({ title: 'Rank 2 was lost', detail: 'peer 2 closed', action: 'Start a new session.' });
    expect(failed.lost).toEqual([2]);
    expect(controls(failed).stop.disabled).toBe(true);
    const later = replay([step(6), { type: 'stopped', by: 0, atStep: 6 }, { type: 'done', summary: {} }], failed);
    expect(later.phase).toBe('failed');
    expect(later.lost).toEqual([2]);
    expect(progressFigures(later).text).toBe('Epoch 1 of 2 · step 6 / 32 (18%) · failed after 6 s');
  });

  it('an error banner comes and goes without changing the phase', () => {
    const s = replay(
      [{ type: 'error-shown', title: 'Server unreachable', detail: 'Could not reach it.', action: 'Retrying in 2 s.' }],
      training(),
    );
    expect(s.phase).toBe('training');
    expect(s.error).toEqual({ title: 'Server unreachable', detail: 'Could not reach it.', action: 'Retrying in 2 s.' });
    expect(s.log[0]).toMatchObject({ level: 'error', message: 'Server unreachable: Could not reach it.' });
    const cleared = replay([{ type: 'error-dismissed' }], s);
    expect(cleared.error).toBeNull();
    expect(cleared.phase).toBe('training');
  });
});

describe('lost ranks', () => {
  it("a 'rank-lost' event marks the rank lost everywhere it shows", () => {
    const s = replay([{ type: 'rank-lost', rank: 2, reason: 'its tab closed' }], training());
    expect(s.lost).toEqual([2]);
    expect(s.log[0]).toMatchObject({ level: 'error', message: 'Lost rank 2: its tab closed.' });
    expect(statusText(s)).toBe('Training (epoch 1 of 2) on 3 ranks. Lost: rank 2.');
    expect([...ringModel(s).lost]).toEqual([2]);
    expect(rankAverages(s).map((r) => [r.rank, r.lost])).toEqual([
      [0, false],
      [1, false],
      [2, true],
    ]);
  });

  it('a closed link is not a lost rank (links close when the group regroups for a joining tab too); the group says who is lost', () => {
    const before = replay([
      { type: 'config', config: config() },
      waiting(3),
      joined(1),
      { type: 'link', peer: 2, state: 'open' },
      { type: 'link', peer: 2, state: 'closed' },
    ]);
    expect(before.lost).toEqual([]);
    expect(before.log[0]).toMatchObject({ level: 'info', message: 'Link to rank 2: closed.' });

    const during = replay([{ type: 'link', peer: 2, state: 'closed' }], training());
    expect(during.lost).toEqual([]);
    expect(during.log.some((e) => e.level === 'error')).toBe(false);
    expect(during.log[0]).toMatchObject({ level: 'warn', message: 'Link to rank 2: closed.' });
    expect(during.links.get(2)).toEqual({ state: 'closed', throughputMBps: undefined });
  });

  it("one closed tab is one error in the log, however many ways it is told; the faults are the server's record, not this tab's count", () => {
    // Rank 2's tab closes: its links close, the group reports it (directly, and passed on), then the
    // survivors regroup and the old group's last links close under the new numbering.
    const s = replay(
      [
        { type: 'link', peer: 2, state: 'closed' },
        { type: 'rank-lost', rank: 2, reason: 'its tab closed' },
        { type: 'rank-lost', rank: 2, reason: 'reported by rank 0: its tab closed' },
        joined(0, 2),
        { type: 'link', peer: 1, state: 'closed' },
        step(6, { ranks: [0, 1] }),
        joined(0, 3),
        { type: 'rank-lost', rank: 1, reason: 'stalled: no sign of life for 10183 ms (its page is paused, frozen or gone)' },
        joined(0, 2),
        { type: 'rank-lost', rank: 1, reason: 'its replica diverged' },
      ],
      training(),
    );
    // What this tab saw counts nothing: the faults are the server's record, which every tab gets whole.
    expect(s.faults.counts).toEqual({ left: 0, froze: 0, removed: 0, failed: 0, joined: 0 });
    const server = replay(
      [
        {
          type: 'faults',
          counts: { left: 1, froze: 1, removed: 0, failed: 0, joined: 2 },
          entries: [
            { kind: 'left', round: 2, rank: 2, reason: 'its tab closed' },
            { kind: 'joined', round: 4, rank: 2, reason: '' },
            { kind: 'froze', round: 4, rank: 1, reason: 'was evicted: nothing received from it for 3100 ms (frozen or hung)' },
          ],
        },
        { type: 'steps-redone', steps: 1 },
      ],
      s,
    );
    expect(faultSummary(server)).toBe('1 tab closed, 1 tab froze or went silent, 2 tabs joined mid-run, 1 step trained again');
    // Three of the four faults are listed (the server keeps the latest): the list says so.
    expect(faultHistoryLines(server)).toEqual([
      '1 earlier fault not listed',
      'Round 2: lost rank 2 (its tab closed)',
      'Round 4: a tab joined as rank 2',
      'Round 4: lost rank 1 (was evicted: nothing received from it for 3100 ms (frozen or hung))',
    ]);
    expect(facts(server).faults.text).toBe(faultSummary(server));
    // At the end, the run's own figure of steps trained again (the run record's) is the one shown.
    expect(runReport(replay([{ type: 'done', summary: { stepsRedone: 1 } }], server))?.main.find((e) => e.key === 'faults')?.value).toBe(
      faultSummary(server),
    );
    // Newest first.
    expect(s.log.filter((e) => e.level === 'error').map((e) => e.message)).toEqual([
      'Lost rank 1: its replica diverged.',
      'Lost rank 1: stalled: no sign of life for 10183 ms (its page is paused, frozen or gone).',
      'Lost rank 2: its tab closed.',
    ]);
  });

  it("a link's path is kept while it is open, told once per kind, and drawn in a few characters", () => {
    const relay = {
      local: 'relay',
      remote: 'relay',
      protocol: 'udp',
      rttMs: 3.1,
      sentBytesPerSec: 1_200_000,
      receivedBytesPerSec: 900_000,
    } as const;
    const s = replay(
      [
        { type: 'link', peer: 2, state: 'open' },
        { type: 'link', peer: 2, state: 'open', throughputMBps: 2.1, path: relay },
        { type: 'link', peer: 2, state: 'open', throughputMBps: 2.3, path: { ...relay, rttMs: 2.9 } },
        { type: 'link', peer: 2, state: 'open' },
      ],
      training(),
    );
    expect(s.links.get(2)).toEqual({ state: 'open', throughputMBps: 2.3, path: { ...relay, rttMs: 2.9 } });
    expect(ringModel(s).observedLinks.get(2)?.path?.local).toBe('relay');
    expect(s.log.filter((e) => e.message.startsWith('Link to rank 2 goes')).map((e) => e.message)).toEqual([
      'Link to rank 2 goes through a TURN relay (relay ↔ relay), round trip 3.1 ms.',
    ]);
    const moved = replay([{ type: 'link', peer: 2, state: 'open', path: { ...relay, local: 'host', remote: 'host', rttMs: 0.4 } }], s);
    expect(moved.log[0]!.message).toBe('Link to rank 2 goes directly (host ↔ host), round trip 0.4 ms.');
    expect(replay([{ type: 'link', peer: 2, state: 'closed' }], s).links.get(2)?.path).toBeUndefined();
    expect(pathWords({ local: 'srflx', remote: 'prflx', rttMs: null })).toBe('directly, through NAT (srflx ↔ prflx)');
    expect(pathLabel(relay)).toBe('relay · 3.1 ms');
    expect(pathLabel({ ...relay, local: 'host', remote: 'prflx', rttMs: 12.4 })).toBe('host ↔ prflx · 12 ms');
    expect(pathLabel({ ...relay, local: null, rttMs: null })).toBe('? ↔ relay');
  });

  it('a waiting event never makes a rank lost', () => {
    const s = replay([waiting(2, 2, 3)], training({ min: 2, max: 3 }));
    expect(s.lost).toEqual([]);
  });

  it('after done, a rank closing its tab is not a loss', () => {
    const s = replay(
      [
        { type: 'done', summary: {} },
        { type: 'rank-lost', rank: 0, reason: 'its tab closed' },
      ],
      training(),
    );
    expect(s.lost).toEqual([]);
    expect(s.log[0]!.message).toBe('Lost rank 0: its tab closed.');
  });

  it("the ring's dots move on with the steps (no animation of their own)", () => {
    const s = training();
    expect(ringModel(s)).toMatchObject({ active: true, step: 5 });
    expect(ringModel(replay([step(6)], s)).step).toBe(6);
  });

  it('a new group renumbers the ranks, so lost ranks and links start over', () => {
    const s = replay(
      [{ type: 'link', peer: 2, state: 'open', throughputMBps: 12 }, { type: 'rank-lost', rank: 2, reason: 'froze' }, joined(1, 2)],
      training({ min: 2, max: 3 }),
    );
    expect(s.lost).toEqual([]);
    expect(s.links.size).toBe(0);
    expect(s.joined).toEqual([1]);
    expect(ringModel(s)).toMatchObject({ worldSize: 2, self: 1, ringProven: false });
    expect(s.log[0]!.message).toBe('New group: this tab is rank 1 of 2.');
  });
});

describe('progress and time left', () => {
  it('the step rate and the time left come from the steps’ own elapsed seconds (time_left.ts)', () => {
    const s = replay([
      { type: 'config', config: config() },
      joined(1),
      step(10, { total: 100, elapsed: 5 }),
      step(20, { total: 100, elapsed: 10 }),
    ]);
    expect(stepSeconds(s)).toBe(0.5);
    // 80 steps of 0.5 s, then the evaluation at step 100 (the end), not timed yet: predicted.
    expect(timeLeft(s)!.seconds).toBeCloseTo(40 + predictedEvalSeconds(s, 0.5)!, 9);
    expect(progressFigures(s).text).toBe(`Epoch 1 of 2 · step 20 / 100 (20%) · 2.0 steps/s · ${timeLeft(s)!.text}`);
    expect(statCards(s).time).toEqual({ value: '10 s', sub: `elapsed · ${timeLeft(s)!.text}` });
  });

  it('the step time is over the last steps, so it follows a speed-up', () => {
    const slow = Array.from({ length: 50 }, (_, i) => step(i + 1, { total: 100, elapsed: i + 1 }));
    const fast = Array.from({ length: 40 }, (_, i) => step(51 + i, { total: 100, elapsed: 50 + (i + 1) * 0.25 }));
    const s = replay([joined(1), ...slow, ...fast]);
    expect(stepSeconds(s)).toBe(0.25);
    expect(timeLeft(s)!.seconds).toBe(2.5);
  });

  it('with a single step there is no step time yet: its elapsed time holds the page’s start', () => {
    const s = replay([joined(0), step(4, { total: 10, elapsed: 20 })]);
    expect(stepSeconds(s)).toBeNull();
    expect(timeLeft(s)).toBeNull();
    expect(progressFigures(s).text).toBe('Epoch 1 · step 4 / 10 (40%) · estimating time left…');
    expect(statCards(s).time.sub).toBe('elapsed');
  });

  it('before any step there is no rate and no bar', () => {
    const s = replay([joined(0)]);
    expect(stepSeconds(s)).toBeNull();
    expect(timeLeft(s)).toBeNull();
    expect(progressFigures(s)).toEqual({ step: 0, total: 0, value: 0, max: 1, done: false, text: 'No steps yet.' });
  });
});

describe('per-rank averages', () => {
  it('average each rank over its last 20 steps, skipping figures that are not finite', () => {
    const events = Array.from({ length: 25 }, (_, i) => {
      const n = i + 1;
      return step(n, {
        ranks: [
          metrics(0, { samplesPerSec: n, loss: 1, breakdownMs: { compute: 10, readback: 1, allreduce: n, apply: 2 } }),
          metrics(1, { samplesPerSec: 100, loss: n % 2 ? NaN : 3, accuracy: 0.5 }),
        ],
      });
    });
    const s = replay([{ type: 'config', config: config({ min: 2, max: 2 }) }, joined(1, 2), ...events]);
    const [r0, r1] = rankAverages(s);
    expect(r0).toEqual({
      rank: 0,
      samplesPerSec: 15.5,
      breakdownMs: { compute: 10, readback: 1, allreduce: 15.5, apply: 2 },
      totalMs: 28.5,
      self: false,
      lost: false,
    });
    expect(r1).toMatchObject({ rank: 1, samplesPerSec: 100, totalMs: 18, self: true });
    const cards = statCards(s);
    // Loss: rank 0's twenty 1s and rank 1's ten finite 3s.
    expect(cards.loss).toEqual({ value: '1.667', sub: 'all ranks, last 20 steps' });
    expect(cards.acc).toEqual({ value: '65.0%', sub: 'training batches, same window' });
    expect(cards.speed).toEqual({ value: '116', unit: ' samples/s', sub: '2 ranks · global batch 128' });
    expect(cards.test).toEqual({ value: '–', sub: 'no evaluation yet' });
  });

  it('an eval shows the latest test accuracy and the best so far', () => {
    const s = replay(
      [
        { type: 'eval', epoch: 0, step: 5, testAccuracy: 0.9, testLoss: 0.3 },
        { type: 'eval', epoch: 0, step: 10, testAccuracy: 0.85, testLoss: 0.35 },
      ],
      training(),
    );
    expect(statCards(s).test).toEqual({ value: '85.0%', sub: 'at step 10, loss 0.35 · best 90.0%' });
    expect(s.log[0]!.message).toBe('Eval at step 10 (epoch 1): test accuracy 85.00%, test loss 0.35.');
  });
});

describe('the run summary', () => {
  it('lists scalars, most interesting first, accuracy as a percent and breakdownMs flattened', () => {
    const entries = summaryEntries({
      rank: 0,
      worldSize: 3,
      model: 'mlp',
      weightHash: '9f3c2a71',
      breakdownMs: { compute: 37.9, allreduce: 126.4 },
      samplesSeen: [{ spans: [[0, 10]] }],
      seconds: 65,
      testAccuracy: 0.9312,
      stoppedBy: 1,
      samplesPerSec: 4215.7,
      steps: 32,
    });
    expect(entries.map((e) => [e.label, e.value])).toEqual([
      ['Test accuracy', '93.12%'],
      ['Steps', '32'],
      ['Time', '1 min 05 s'],
      ['Samples per sec', '4,216'],
      ['Stopped by', 'rank 1'],
      ['Weight hash', '9f3c2a71'],
      ['Breakdown: compute', '37.9 ms'],
      ['Breakdown: allreduce', '126 ms'],
    ]);
  });

  it("'done' logs the report's main line", () => {
    const s = replay(
      [step(32, { epoch: 1, elapsed: 60 }), { type: 'done', summary: { steps: 32, testAccuracy: 0.5, testLoss: 1.25, seconds: 65 } }],
      training(),
    );
    expect(s.log[0]!.message).toBe(
      'Done. Training: 32 steps · 2 epochs · 3 tabs at the end, Total time: 1 min 05 s, Final test accuracy: 50.00%, Faults survived: none',
    );
    expect(s.summary).toEqual({ steps: 32, testAccuracy: 0.5, testLoss: 1.25, seconds: 65 });
  });

  it('the report for people: what, how long (one total everywhere), how well, how fast, what it survived; the rest under Details', () => {
    const events: DashboardEvent[] = [
      { type: 'rank-lost', rank: 2, reason: 'its tab closed' },
      {
        type: 'faults',
        counts: { left: 1, froze: 0, removed: 0, failed: 0, joined: 0 },
        entries: [{ kind: 'left', round: 1, rank: 2, reason: 'its tab closed' }],
      },
      joined(1, 2),
      step(6, { ranks: [0, 1] }),
      joined(1, 3),
      {
        type: 'faults',
        counts: { left: 1, froze: 0, removed: 0, failed: 0, joined: 1 },
        entries: [
          { kind: 'left', round: 1, rank: 2, reason: 'its tab closed' },
          { kind: 'joined', round: 3, rank: 2, reason: '' },
        ],
      },
      step(31, { epoch: 1, elapsed: 58, ranks: [0, 1, 2] }),
      step(32, { epoch: 1, elapsed: 60, ranks: [0, 1, 2] }),
      {
        type: 'done',
        summary: {
          rank: 1,
          worldSize: 3,
          backend: 'webgpu',
          model: 'mlp',
          dataset: 'synthetic',
          steps: 32,
          epochs: 1,
          samplesPerSec: 4215.7,
          finalLoss: 0.31,
          testAccuracy: 0.9312,
          testLoss: 0.22,
          weightHash: '9f3c2a71',
          breakdownMs: { compute: 37.9, readback: 1, allreduce: 12, apply: 2 },
          seconds: 65,
          generations: 3,
          stepsRedone: 1,
          pausedGenerations: 0,
          resumes: [],
          liveTensors: { steps: 32, min: 40, max: 40 },
        },
      },
    ];
    const s = replay(events, training({ min: 2, max: 3 }));
    const report = runReport(s)!;
    expect(report.main.map((e) => [e.label, e.value])).toEqual([
      ['Trained', 'MLP on synthetic data, 1,536 training samples'],
      ['Training', '32 steps · 2 epochs · 3 tabs at the end'],
      ['Total time', '1 min 05 s'],
      ['Final test accuracy', '93.12%'],
      ['Speed', '4,216 samples/s, all tabs together'],
      ['Faults survived', '1 tab closed, 1 tab joined mid-run, 1 step trained again'],
    ]);
    const details = report.details.map((e) => e.label);
    expect(details).toEqual(
      expect.arrayContaining([
        'Test loss',
        'Final loss',
        'Generations',
        'Paused generations',
        'Weight hash',
        'Breakdown: compute',
        'Live tensors: min',
        'Live tensors: max',
      ]),
    );
    for (const shown of ['Test accuracy', 'Steps', 'Epochs', 'Time', 'Samples per sec', 'Steps redone'])
      expect(details).not.toContain(shown);
    // One total time: the status line, the progress text, the time card and the report agree.
    expect(runSeconds(s)).toBe(65);
    expect(statusText(s)).toBe('Done. 32 steps in 1 min 05 s. Final test accuracy 93.1%. The model can be downloaded.');
    expect(progressFigures(s).text).toContain('finished in 1 min 05 s');
    expect(statCards(s).time).toEqual({ value: '1 min 05 s', sub: 'total time' });
  });

  it('epochs are counted from 1 in the report, also inside the first epoch', () => {
    const s = replay([{ type: 'done', summary: { steps: 5, epochs: 0 } }], training({ steps: 5 }));
    expect(runReport(s)!.main.find((e) => e.key === 'training')!.value).toBe('5 steps · in epoch 1 · 3 tabs at the end');
    expect(JSON.stringify(runReport(s))).not.toMatch(/Epochs/);
  });
});

describe('epochs', () => {
  it("a 0-based job is numbered from 1 for people (equal shards, as torch's DistributedSampler)", () => {
    const s = replay([step(17, { epoch: 1 })], training({ balance: false }));
    expect(s.epochBase).toBe(0);
    expect(s.log.map((e) => e.message)).toContain("Epoch 1: this rank's shard is 512 of 1,536 samples, 16 steps.");
    expect(s.log[0]!.message).toBe('Epoch 2 started at step 17.');
    expect(statusText(s)).toBe('Training (epoch 2 of 2) on 3 ranks.');
    expect(facts(s).shard).toBe('512 of 1,536 samples · epoch 1 of 2 · 16 steps/epoch');
  });

  it('with balanced batches no rank holds a fixed shard: the facts and the log say the samples are split by speed', () => {
    const s = replay([step(17, { epoch: 1 })], training({ balance: true }));
    expect(s.log.map((e) => e.message)).toContain(
      "Epoch 1: the group's 1,536 samples, 16 steps, each step's batch split by the tabs' speeds.",
    );
    expect(facts(s).shard).toBe('1,536 samples shared by speed, step by step · epoch 1 of 2 · 16 steps/epoch');
  });

  it('a 1-based job keeps its numbers, and a job of steps has no epoch total', () => {
    const s = replay([{ type: 'config', config: config({ steps: 50 }) }, joined(0), step(1, { epoch: 1, total: 50 })]);
    expect(s.epochBase).toBe(1);
    expect(statusText(s)).toBe('Training (epoch 1) on 3 ranks.');
  });
});

describe('the log', () => {
  it('is newest first and keeps the last MAX_LOG entries, with the times of their actions', () => {
    const events: DashboardEvent[] = Array.from({ length: 450 }, (_, i) => ({ type: 'log', level: 'info', message: `message ${i}` }));
    const s = replay(events);
    expect(s.log).toHaveLength(MAX_LOG);
    expect(s.log[0]).toEqual({ id: 450, at: T0 + 450_000, level: 'info', message: 'message 449' });
    expect(s.log[MAX_LOG - 1]!.message).toBe('message 50');
  });
});

describe('purity and the facts', () => {
  it('the same action on the same state gives the same state, and the input is left alone', () => {
    const s = training();
    const snapshot = structuredClone(s);
    const action = { at: T0 + 99_000, event: step(6) };
    expect(reduceDashboard(s, action)).toEqual(reduceDashboard(s, action));
    expect(s).toEqual(snapshot);
  });

  it('parts that did not change keep their identity, so views can skip them', () => {
    const s = training();
    const next = replay([step(6)], s);
    expect(next.joined).toBe(s.joined);
    expect(next.lost).toBe(s.lost);
    expect(next.links).toBe(s.links);
    expect(next.log).toBe(s.log);
  });

  it('before a group exists the ring has the session’s largest size and nobody in it', () => {
    const s = replay([{ type: 'config', config: config({ min: 2, max: 4 }) }, waiting(1, 2, 4)]);
    expect(ringModel(s)).toMatchObject({ worldSize: 4, self: null, ringProven: false, active: false });
    expect(facts(s).rank.text).toBe('joining… · 2 to 4 tabs');
  });

  it('a backend fallback is a warning, and the facts say from what and why', () => {
    const s = replay([
      { type: 'config', config: config() },
      { type: 'joined', rank: 0, worldSize: 3, backend: 'wasm', adapter: null, fallbackReason: 'no WebGPU adapter' },
    ]);
    expect(s.log[0]).toMatchObject({ level: 'warn', message: 'This tab joined as rank 0 of 3 (backend wasm, a fallback from webgpu).' });
    expect(facts(s).backend).toEqual({
      kind: 'running',
      name: 'wasm',
      detail: ' · on the CPU',
      fallback: '⚠ Fallback from webgpu: no WebGPU adapter',
      probe: null,
    });
  });

  it('backend=auto: the facts show every backend measured, the chosen one marked, and why one has no figure', () => {
    const probe = [
      { backend: 'cpu' as const, msPerStep: 412.4, steps: 3 },
      { backend: 'wasm' as const, msPerStep: null, steps: 0, note: 'it cannot train this model: no kernel' },
      { backend: 'webgpu' as const, msPerStep: null, steps: 0, note: 'no step finished within 3 s: abandoned' },
    ];
    const s = replay([
      { type: 'config', config: config({ backend: 'auto' }) },
      { type: 'joined', rank: 0, worldSize: 3, backend: 'cpu', adapter: null, probe },
    ]);
    expect(facts(s).backend).toMatchObject({
      kind: 'running',
      name: 'cpu',
      fallback: null,
      probe:
        'auto, measured on this model: cpu 412 ms/step (chosen) · wasm – (it cannot train this model: no kernel) · webgpu – (no step finished within 3 s: abandoned)',
    });
  });

  it('describes a job in one line', () => {
    expect(describeJob(config())).toBe('mlp on synthetic · adam lr 0.003 · batch 64/rank (192 global) · 2 epochs');
    expect(describeJob(config({ min: 2, max: 4, steps: 1000, trainSize: 1536 }))).toBe(
      'mlp on synthetic · adam lr 0.003 · batch 64/rank (up to 256 global) · 1,000 steps · first 1,536 samples · elastic, 2 to 4 tabs',
    );
    // --hidden: said when given, not when the model's default.
    expect(describeJob(config({ model: 'cnn', hidden: 2048 }))).toBe(
      'cnn (2,048 hidden) on synthetic · adam lr 0.003 · batch 64/rank (192 global) · 2 epochs',
    );
    expect(describeJob(config({ model: 'cnn', hidden: 0 }))).toBe(
      'cnn (no hidden layer) on synthetic · adam lr 0.003 · batch 64/rank (192 global) · 2 epochs',
    );
  });
});

describe('the communication hook (--comm-hook) on the performance card', () => {
  /** Steps 1..k of ranks 0 and 1, each sending `sent(step, rank)` bytes of a baseline of 1000. */
  const steps = (k: number, sent: (n: number, r: number) => number) =>
    Array.from({ length: k }, (_, i) =>
      step(i + 1, { ranks: [0, 1].map((r) => metrics(r, { commBytes: sent(i + 1, r), commDenseBytes: 1000 })) }),
    );

  it('says the hook, the bytes per rank per step and the ratio to the float32 all-reduce, over the recent steps', () => {
    const s = replay([
      { type: 'config', config: config({ min: 2, max: 2, commHook: { kind: 'powersgd', rank: 2, startIter: 10, wire: 'float32' } }) },
      joined(0, 2),
      ...steps(30, (n) => (n <= 10 ? 1000 : 100)),
    ]);
    // The last 20 steps (11..30) per rank: all compressed.
    expect(commFigures(s)).toEqual({
      hook: 'PowerSGD, rank 2, after 10 plain steps',
      bytesPerStep: 100,
      ratio: 0.1,
      text: 'Gradients: PowerSGD, rank 2, after 10 plain steps · 100 B sent per rank per step · 0.1× the float32 all-reduce’s bytes',
    });
    expect(rankAverages(s).map((r) => r.bytesPerStep)).toEqual([100, 100]);
    // Steps 1..20, the window: ten plain (1000 bytes), ten compressed (100 + rank).
    const early = replay([
      { type: 'config', config: config({ min: 2, max: 2, commHook: { kind: 'powersgd', rank: 2, startIter: 10, wire: 'float32' } }) },
      joined(0, 2),
      ...steps(20, (n, r) => (n <= 10 ? 1000 : 100 + r)),
    ]);
    expect(commFigures(early)).toMatchObject({ bytesPerStep: 550.25, ratio: 0.55025 });
  });

  it('the plain all-reduce reads as such, with a ratio of 1; before any step only the hook', () => {
    const before = replay([{ type: 'config', config: config({ min: 2, max: 2 }) }, joined(0, 2)]);
    expect(commFigures(before)).toEqual({
      hook: 'float32 all-reduce',
      bytesPerStep: null,
      ratio: null,
      text: 'Gradients: float32 all-reduce',
    });
    const s = replay(
      steps(3, () => 1000),
      before,
    );
    expect(commFigures(s)?.text).toBe('Gradients: float32 all-reduce · 1 kB sent per rank per step · 1× the float32 all-reduce’s bytes');
    // Large figures in kB and MB.
    const big = replay(
      steps(2, () => 2_450_000),
      before,
    );
    expect(commFigures(big)?.text).toMatch(/ · 2\.45 MB sent per rank per step · 2,450× /);
  });

  it('ranks that do not say their bytes (pipelines, parameter servers) have none; those runs have no line', () => {
    const s = training();
    expect(rankAverages(s)[0]).not.toHaveProperty('bytesPerStep');
    expect(commFigures(s)).toMatchObject({ bytesPerStep: null, ratio: null });
    expect(commFigures(training({ pp: 3, dp: 1 }))).toBeNull();
    expect(commFigures(training({ strategy: 'central' }))).toBeNull();
    expect(commFigures(initialDashboardState({ session: 's', at: T0 }))).toBeNull();
    // A step whose baseline is missing gives bytes but no ratio.
    const partial = replay(
      [step(6, { ranks: [metrics(0, { commBytes: 10 }), metrics(1, { commBytes: 30, commDenseBytes: 100 })] })],
      training(),
    );
    expect(commFigures(partial)).toMatchObject({ bytesPerStep: 20, ratio: null });
  });

  it('the job line names the hook when it is not the plain all-reduce', () => {
    expect(describeJob(config({ commHook: { kind: 'fp16' } }))).toBe(
      'mlp on synthetic · adam lr 0.003 · batch 64/rank (192 global) · 2 epochs · fp16 compression (float16 on the wire)',
    );
    expect(describeJob(config({ commHook: { kind: 'none' } }))).toBe(
      'mlp on synthetic · adam lr 0.003 · batch 64/rank (192 global) · 2 epochs',
    );
    expect(describeCommHook({ kind: 'bf16' })).toBe('bf16 compression (bfloat16 on the wire)');
    expect(describeCommHook({ kind: 'localsgd', period: 4, startStep: 1 })).toBe(
      'local SGD, models averaged every 4 steps after 1 averaged step',
    );
    expect(describeCommHook({ kind: 'powersgd', rank: 1, startIter: 0, wire: 'float32' })).toBe('PowerSGD, rank 1, after 0 plain steps');
  });
});

describe('time left with evaluation pauses', () => {
  it('measures an evaluation as the gap after its step, and leaves it out of the step rate', () => {
    // Steps every second; the eval after step 10 takes 4 s, so step 11 comes 5 s after step 10.
    let s = replay([
      { type: 'config', config: config({ evalEvery: 10 }) },
      joined(0),
      { type: 'shard', epoch: 0, samples: 1000, datasetSize: 1000, stepsPerEpoch: 50 },
    ]);
    const at0 = T0 + 100_000;
    for (let n = 1; n <= 10; n++) s = reduceDashboard(s, { at: at0 + n * 1000, event: step(n, { total: 50, elapsed: n }) });
    s = reduceDashboard(s, { at: at0 + 14_000, event: { type: 'eval', epoch: 0, step: 10, testAccuracy: 0.5, testLoss: 1 } });
    s = reduceDashboard(s, { at: at0 + 15_000, event: step(11, { total: 50, elapsed: 15 }) });
    expect(evalSeconds(s)).toBe(4);
    expect(stepSeconds(s)).toBe(1);
    // Evals left: steps 20, 30, 40 and 50 (the epoch end and the run's end are the same step).
    expect(evalsLeft(s)).toBe(4);
    expect(timeLeft(s)!.seconds).toBe(39 + 4 * 4);
  });

  it('counts the final evaluation when the run ends between evaluation steps', () => {
    const s = replay([
      { type: 'config', config: config({ evalEvery: 100, steps: 250 }) },
      joined(0),
      { type: 'shard', epoch: 0, samples: 1000, datasetSize: 1000, stepsPerEpoch: 1000 },
      step(10, { total: 250 }),
    ]);
    expect(evalsLeft(s)).toBe(2 + 1); // steps 100 and 200, then the end (250)
  });
});

describe('roles: the host, the other tabs, spectators', () => {
  const role = (host: boolean, hasHost: boolean, spectator = false): DashboardEvent => ({ type: 'role', host, hasHost, spectator });

  it('the host has stop, end and the minimum; its stop and end are confirmed first', () => {
    const s = replay([{ type: 'config', config: config({ min: 1, max: 3 }) }, waiting(1, 1, 3), joined(0), role(true, true)]);
    const c = controls(s);
    expect(c.stop).toEqual({ visible: true, disabled: false, label: 'Stop training for everyone' });
    expect(c.end).toEqual({ visible: true, disabled: false });
    expect(c.min).toEqual({ visible: true, disabled: false, value: 1, max: 3 });
    expect(c.note).toBeNull();
    expect(s.log[0]!.message).toBe('This tab is the host: it can stop the training or end the session for everyone.');
    expect(CONFIRM.stop.body).toMatch(/Every tab of the session stops at the same step/);
    expect(CONFIRM.end.body).toMatch(/every tab is disconnected/);
  });

  it("other tabs of a hosted session have no such buttons and say the host's tab controls it", () => {
    const c = controls(replay([role(false, true)], training()));
    expect(c.stop.visible).toBe(false);
    expect(c.end.visible).toBe(false);
    expect(c.min.visible).toBe(false);
    expect(c.note).toBe("The host's tab controls this session: it can stop the training or end the session.");
  });

  it('a session without a host (the launcher’s) keeps the stop button on every tab', () => {
    const c = controls(replay([role(false, false)], training()));
    expect(c.stop.visible).toBe(true);
    expect(c.end.visible).toBe(false);
    expect(c.note).toBeNull();
  });

  it('a spectator is told the session is full, calmly, and becomes a rank when it gets one', () => {
    const s = replay([{ type: 'config', config: config({ min: 2, max: 3 }) }, role(false, true, true)]);
    expect(displayPhase(s)).toBe('spectating');
    expect(phaseLabel(s)).toBe('Spectating');
    expect(statusText(s)).toBe('The session is full (3 ranks): this tab watches and takes a rank when one frees up.');
    expect(controls(s).stop.visible).toBe(false);
    const ranked = replay([joined(2, 3)], s);
    expect(ranked.role.spectator).toBe(false);
    expect(displayPhase(ranked)).toBe('starting');
  });

  it('"full" is a state of its own, not a failure', () => {
    const s = replay([
      { type: 'config', config: config() },
      { type: 'full', ranks: 3 },
    ]);
    expect(s.phase).toBe('full');
    expect(s.failure).toBeNull();
    expect(phaseLabel(s)).toBe('Session full');
    expect(statusText(s)).toBe(
      'The session is full: all 3 ranks are taken, so this tab is not training. Keep it for when a tab closes (reload it then), or create a new session.',
    );
    expect(controls(s).stop.disabled).toBe(true);
  });

  it('the host’s actions are announced on every tab', () => {
    const stopped = replay(
      [
        { type: 'control', action: 'stop' },
        { type: 'stopped', by: 0, atStep: 6 },
      ],
      training(),
    );
    expect(stopped.log[1]!.message).toBe('The host stopped the run: every tab stops at the same step.');
    expect(stopped.log[0]!.message).toBe('Training stopped at step 6 by the host.');
    expect(statusText(stopped)).toBe('Stopped by the host at step 6. The model trained so far can be downloaded now.');

    const min = replay(
      [
        { type: 'min-requested', min: 2 },
        { type: 'control', action: 'min', min: 2 },
      ],
      replay([role(true, true)], training({ min: 3, max: 3 })),
    );
    expect(min.config!.min).toBe(2);
    expect(controls(min).min.value).toBe(2);
    expect(min.log[0]!.message).toBe('The host set the minimum to 2 tabs: training goes on while at least 2 are in.');

    const ended = replay(
      [
        { type: 'control', action: 'end' },
        { type: 'failed', title: 'Server unreachable', detail: 'connection closed' },
      ],
      training(),
    );
    expect(ended.phase).toBe('ended');
    expect(ended.error).toBeNull();
    expect(statusText(ended)).toBe('The host ended the session at step 5: this tab is disconnected.');
    expect(phaseLabel(ended)).toBe('Session ended');
  });
});

describe('after a failure', () => {
  it('"Training failed" is never said twice', () => {
    const s = replay([{ type: 'failed', title: 'Training failed', detail: 'Training failed.' }], training());
    expect(statusText(s)).toBe('Training failed at step 5: see the message below.');
  });

  it('the page may keep the model downloadable and offer to continue', () => {
    const failed = replay(
      [
        { type: 'failed', title: 'Rank 2 was lost', detail: 'peer 2 closed', canContinue: true },
        { type: 'downloadable', available: true },
      ],
      training(),
    );
    expect(controls(failed)).toMatchObject({ continueVisible: true, downloadEnabled: true });
    expect(statusText(failed)).toBe(
      'Training failed at step 5: Rank 2 was lost. The model trained so far is kept: you can continue training.',
    );
    const again = replay([{ type: 'continue-requested' }], failed);
    expect(again.phase).toBe('starting');
    expect(again.failure).toBeNull();
    expect(controls(again).continueVisible).toBe(false);
    expect(replay([step(6)], again).phase).toBe('training');
    // Without canContinue there is no button, and the request does nothing.
    const final = replay([{ type: 'failed', title: 'Replicas differ', detail: 'x' }], training());
    expect(controls(final).continueVisible).toBe(false);
    expect(replay([{ type: 'continue-requested' }], final)).toBe(final);
  });

  it('downloads are named after the session and the step', () => {
    expect(downloadBaseName(replay([{ type: 'done', summary: {} }], training()))).toBe('s-step-5');
    expect(downloadBaseName(initialDashboardState({ session: 'my run', at: T0 }))).toBe('my_run-step-0');
  });
});

describe('waiting and WebGPU words', () => {
  it('never says nobody is here while this tab waits', () => {
    const s = replay([{ type: 'config', config: config() }, waiting(0)]);
    expect(statusText(s)).toBe('Waiting for 2 more tabs (1 of 3 here). Share the link below.');
  });

  it('WebGPU missing on a plain-http page is the page’s doing, and says how to get it', () => {
    const reason =
      'WebGPU needs a secure page (https, or localhost). This tab trains on webgl meanwhile; to use WebGPU, open the session over https (see docs/deployment.md, “Across machines”)';
    const s = replay([
      { type: 'config', config: config() },
      { type: 'joined', rank: 0, worldSize: 3, backend: 'webgl', adapter: null, fallbackReason: reason },
    ]);
    expect(facts(s).backend).toMatchObject({ kind: 'running', name: 'webgl', fallback: `⚠ ${reason}.` });
    expect(JSON.stringify(facts(s))).not.toMatch(/browser has no WebGPU/);
  });
});

describe('pipeline runs', () => {
  // 2 stages x 2 replicas (rank = replica * 2 + stage); this tab is rank 3: stage 1 of replica 1.
  const layers = [
    { index: 0, className: 'Flatten', parameters: 0, stage: 0 },
    { index: 1, className: 'Dense', parameters: 100_480, stage: 0 },
    { index: 2, className: 'Dense', parameters: 1_290, stage: 1 },
  ];
  const layout: TrainEvent = {
    type: 'pipeline',
    stage: 1,
    stages: 2,
    replica: 1,
    replicas: 2,
    schedule: 'gpipe',
    microBatches: 4,
    layers,
    bubbleFormula: 0.2,
  };
  const pipeCfg = config({ min: 4, max: 4, pp: 2, dp: 2, microBatches: 4 });
  const pm = (rank: number, bubble: number, over: Partial<RankStepMetrics> = {}): RankStepMetrics =>
    metrics(rank, { pipeline: { stage: rank % 2, replica: Math.floor(rank / 2), bubble, waitActivations: 1, waitGradients: 2 }, ...over });
  const pipeStep = (n: number, bubbles = [0.3, 0.25, 0.2, 0.15]) =>
    step(n, { ranks: bubbles.map((b, r) => pm(r, b, { samplesPerSec: 100 + r })) });
  const started = (): DashboardState =>
    replay([
      { type: 'config', config: pipeCfg },
      waiting(4, 4, 4),
      joined(3, 4),
      layout,
      { type: 'shard', epoch: 0, samples: 512, datasetSize: 1024, stepsPerEpoch: 8 },
      pipeStep(1),
    ]);
  const timeline: TrainEvent = {
    type: 'timeline',
    step: 4,
    stages: [
      {
        stage: 1,
        totalMs: 10,
        entries: [
          { phase: 'F', microBatch: 0, start: 2, end: 3.1 },
          { phase: 'B', microBatch: 2, start: 3.1, end: 5.4 },
        ],
      },
      {
        stage: 0,
        totalMs: 9,
        entries: [
          { phase: 'F', microBatch: 0, start: 0, end: 2 },
          { phase: 'B', microBatch: 0, start: 6, end: 8 },
        ],
      },
    ],
  };

  it('a plain data-parallel run has no pipeline panel, no timeline, and its steps keep the (empty) pipeline figures as they were', () => {
    const s = training();
    expect(s.pipeline).toBeNull();
    expect(s.timeline).toBeNull();
    expect(s.pipelineRanks.size).toBe(0);
    expect(pipelinePanel(s)).toBeNull();
    expect(timelineModel(s)).toBeNull();
    expect(replay([step(6)], s).pipelineRanks).toBe(s.pipelineRanks);
  });

  it("'pipeline' keeps the layout and logs this tab's place once, not again on the next round's same layout", () => {
    const s = started();
    expect(s.pipeline).toEqual({
      stage: 1,
      stages: 2,
      replica: 1,
      replicas: 2,
      schedule: 'gpipe',
      microBatches: 4,
      layers,
      bubbleFormula: 0.2,
    });
    const lines = s.log.filter((e) => e.message.startsWith('Pipeline:')).map((e) => e.message);
    expect(lines).toEqual([
      'Pipeline: this tab is stage 1 of 2 (replica 1 of 2), layers 2 Dense (1,290 parameters); gpipe schedule, 4 micro-batches, bubble 20.0% by the formula.',
    ]);
    const again = replay([layout], s);
    expect(again.log.length).toBe(s.log.length);
    expect(again.pipeline).toEqual(s.pipeline);
    const moved = replay([{ ...layout, schedule: '1f1b' } as TrainEvent], s);
    expect(moved.log[0]!.message).toMatch(/^Pipeline: this tab is stage 1 of 2 .*1f1b schedule/);
  });

  it("each step's pipeline figures are kept by rank; a new group starts them again but keeps the layout", () => {
    const s = replay([pipeStep(2, [0.5, 0.4, 0.3, 0.2])], started());
    expect(s.pipelineRanks.get(2)).toEqual({ stage: 0, replica: 1, bubble: 0.3, waitActivations: 1, waitGradients: 2 });
    expect([...s.pipelineRanks.keys()].sort()).toEqual([0, 1, 2, 3]);
    const regroup = replay([joined(3, 4)], s);
    expect(regroup.pipelineRanks.size).toBe(0);
    expect(regroup.pipeline).toBe(s.pipeline);
  });

  it('the panel lists each stage with its layers, parameters and ranks, marks this tab, and gives both bubbles', () => {
    const s = started();
    const p = pipelinePanel(s)!;
    expect(
      p.stages.map(({ stage, layersText, parameters, ranks, self, bubble }) => ({ stage, layersText, parameters, ranks, self, bubble })),
    ).toEqual([
      { stage: 0, layersText: '0 Flatten, 1 Dense', parameters: 100_480, ranks: [0, 2], self: false, bubble: 0.25 },
      { stage: 1, layersText: '2 Dense', parameters: 1_290, ranks: [1, 3], self: true, bubble: 0.2 },
    ]);
    expect(p.selfStage).toBe(1);
    expect(p.selfReplica).toBe(1);
    expect(p.shape).toBe('2 stages × 2 replicas · gpipe schedule · 4 micro-batches');
    expect(p.formulaBubble).toBe(0.2);
    expect(p.measuredBubble).toBeCloseTo(0.225);
    expect(p.bubbleText).toBe('Bubble: 22.5% measured (latest step, mean of the stages) · 20.0% by the formula (S−1)/(M+S−1) = 1/5.');
    // Before any step: the formula only.
    // Steps 1..20, the window: ten plain (1000 bytes), ten compressed (100 + rank).
    const early = replay([{ type: 'config', config: pipeCfg }, joined(3, 4), layout]);
    expect(pipelinePanel(early)!.measuredBubble).toBeNull();
    expect(pipelinePanel(early)!.bubbleText).toBe('Bubble: not measured yet · 20.0% by the formula (S−1)/(M+S−1) = 1/5.');
    // A lost rank is marked on its stage.
    const lost = replay([{ type: 'rank-lost', rank: 2, reason: 'tab closed' }], s);
    expect(pipelinePanel(lost)!.stages[0]!.lost).toEqual([2]);
  });

  it("'timeline' draws a row per stage in stage order and a box per pass over the step's span, labelled for screen readers", () => {
    const s = replay([timeline], started());
    const t = timelineModel(s)!;
    expect(t.step).toBe(4);
    expect(t.spanMs).toBe(10);
    expect(t.rows.map((r) => [r.stage, r.self, r.label])).toEqual([
      [0, false, 'stage 0: 2 passes, busy 4.0 of 9.0 ms'],
      [1, true, 'stage 1: 2 passes, busy 3.4 of 10.0 ms'],
    ]);
    const b = t.rows[1]!.boxes[1]!;
    expect(b).toMatchObject({
      phase: 'B',
      microBatch: 2,
      startMs: 3.1,
      endMs: 5.4,
      label: 'stage 1: backward of micro-batch 2, 3.1-5.4 ms',
    });
    expect(b.left).toBeCloseTo(0.31);
    expect(b.width).toBeCloseTo(0.23);
    expect(t.rows[0]!.boxes[0]!.label).toBe('stage 0: forward of micro-batch 0, 0.0-2.0 ms');
    expect(t.ticks.map((x) => x.label)).toEqual(['0 ms', '2 ms', '4 ms', '6 ms', '8 ms', '10 ms']);
    expect(t.ticks.at(-1)!.at).toBeCloseTo(1);
    expect(t.caption).toBe(
      "Step 4 of replica 0's pipeline: forward (F) and backward (B) passes of 4 micro-batches on 2 stages over 10.0 ms; the gaps are the bubble.",
    );
    // The next timeline replaces it; a bad entry (no end) is left out rather than drawn anywhere.
    const next = replay(
      [
        {
          type: 'timeline',
          step: 8,
          stages: [{ stage: 0, totalMs: 4, entries: [{ phase: 'F', microBatch: 1, start: 1, end: Number.NaN }] }],
        },
      ],
      s,
    );
    expect(timelineModel(next)!.step).toBe(8);
    expect(timelineModel(next)!.rows[0]!.boxes).toEqual([]);
  });

  it('throughput counts each replica once (at its first stage) and the global batch is per replica', () => {
    const s = started();
    expect(statCards(s).speed).toEqual({ value: '202', unit: ' samples/s', sub: '2 replicas of 2 stages · global batch 128' });
    expect(describeJob(pipeCfg)).toBe(
      'mlp on synthetic · adam lr 0.003 · batch 64/replica (128 global) · 2 epochs · pipeline of 2 stages × 2 replicas, 4 micro-batches (gpipe)',
    );
    expect(describeJob({ ...pipeCfg, activationDtype: 'float16', schedule: '1f1b' })).toMatch(/\(1f1b, float16 activations\)$/);
  });
});

describe('devices: DataParallel Workers of this tab (--devices)', () => {
  it('lists this tab’s devices in the facts, with their figures once they trained and any fallback; says the start once', () => {
    let s = training({ devices: 2 });
    expect(facts(s).devices).toBeNull();
    s = replay(
      [
        {
          type: 'devices',
          devices: [
            { device: 0, backend: 'webgpu' },
            { device: 1, backend: 'cpu', fallbackReason: 'no WebGPU in this Worker; using cpu instead' },
          ],
        },
      ],
      s,
    );
    expect(s.log[0]!.message).toBe(
      'This tab computes on 2 devices (Workers, each with its own copy of the model): device 0 on webgpu, device 1 on cpu.',
    );
    expect(facts(s).devices).toEqual([
      { text: 'device 0: webgpu', fallback: null },
      { text: 'device 1: cpu', fallback: '⚠ no WebGPU in this Worker; using cpu instead' },
    ]);
    const logged = s.log.length;
    s = replay(
      [
        {
          type: 'devices',
          devices: [{ device: 0, backend: 'webgpu', steps: 10, samples: 320, meanComputeMs: 12.3, liveTensors: { min: 4, max: 4 } }],
        },
      ],
      s,
    );
    expect(s.log.length).toBe(logged);
    expect(facts(s).devices![0]!.text).toBe('device 0: webgpu · 320 samples · 12.3 ms/step');
    expect(describeJob(config({ devices: 2 }))).toMatch(/ · 2 devices per tab$/);
  });

  it('averages each rank’s device compute over its recent steps, and leaves it out for ranks with one device', () => {
    const withDevices = (r: number, meanMs: number) => metrics(r, { devices: { count: 2, meanMs } });
    const s = replay(
      [
        step(6, { ranks: [withDevices(0, 10), metrics(1), withDevices(2, 20)] }),
        step(7, { ranks: [withDevices(0, 30), metrics(1), withDevices(2, 20)] }),
      ],
      training({ devices: 2 }),
    );
    const rows = rankAverages(s);
    expect(rows[0]!.devices).toEqual({ count: 2, meanMs: 20 });
    expect(rows[1]!.devices).toBeUndefined();
    expect(rows[2]!.devices).toEqual({ count: 2, meanMs: 20 });
  });
});
