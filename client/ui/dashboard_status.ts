/**
 * The dashboard's words for where the run is: the phase pill's label and the status line.
 */
import { isOver, type DashboardState, type Phase } from './dashboard_state.ts';
import { controls } from './dashboard_controls.ts';
import { epochOf, plural } from './dashboard_format.ts';
import { runSeconds } from './dashboard_progress.ts';
import { finalTestAccuracy } from './dashboard_report.ts';
import { fmtDuration, fmtInt, fmtPercent } from './format.ts';

const PHASE_LABEL: Readonly<Record<Phase, string>> = {
  connecting: 'Connecting',
  waiting: 'Waiting for tabs',
  starting: 'Starting',
  training: 'Training',
  done: 'Done',
  stopped: 'Stopped',
  failed: 'Failed',
  full: 'Session full',
  ended: 'Session ended',
  removed: 'Removed by the host',
};

/** What the phase pill and the page's data-phase show: a spectating tab is neither waiting nor failed. */
export function displayPhase(s: DashboardState): Phase | 'spectating' {
  return s.role.spectator && !isOver(s.phase) ? 'spectating' : s.phase;
}

export function phaseLabel(s: DashboardState): string {
  if (displayPhase(s) === 'spectating') return 'Spectating';
  if (s.phase === 'training' && s.finalEval !== null) return 'Evaluating';
  return s.phase === 'waiting' && s.waiting?.paused ? 'Paused' : PHASE_LABEL[s.phase];
}

/** The session's size: from the group's events, else the job's. */
function sessionRanks(s: DashboardState): number | null {
  return s.fullRanks ?? s.waiting?.max ?? s.config?.max ?? null;
}

/** A failure title that says nothing more than "it failed" is not repeated after "Training failed". */
function failureReason(s: DashboardState): string {
  const f = s.failure?.trim().replace(/[.:]+$/, '');
  return !f || /^training failed$/i.test(f) ? 'see the message below' : f;
}

/** The evaluation after the run, while it goes on: how far, and that the weights can be saved meanwhile. */
function finalEvalText(s: DashboardState): string | null {
  const fe = s.finalEval;
  if (fe === null || s.finished) return null;
  if (fe.skipped) return 'The evaluation was skipped; finishing.';
  if (fe.skipRequested) return 'Skipping the evaluation…';
  const pct = fe.total > 0 ? Math.floor((fe.done / fe.total) * 100) : 0;
  return `Evaluating on the test set… ${pct}%.`;
}

/** The host skipped the evaluation after the run: a test accuracy from before it is not the final one. */
function evalSkipped(s: DashboardState): boolean {
  return s.finalEval?.skipped === true || s.summary?.evaluationSkipped === true;
}

/** The status line: where the run is and what the person can do. */
export function statusText(s: DashboardState): string {
  const lostNote = s.lost.length ? ` Lost: rank ${s.lost.join(', ')}.` : '';
  if (displayPhase(s) === 'spectating') {
    const n = sessionRanks(s);
    const at = s.lastStep ? ` Training is at step ${fmtInt(s.lastStep.step)}.` : '';
    return `The session is full${n !== null ? ` (${plural(n, 'rank')})` : ''}: this tab watches and takes a rank when one frees up.${at}`;
  }
  if (s.storeUnavailable !== null && !isOver(s.phase))
    return "The session's store is unavailable (its server's Redis does not answer); retrying…";
  switch (s.phase) {
    case 'connecting':
      return 'Connecting to the server…';
    case 'waiting': {
      const w = s.waiting;
      if (!w) return 'Waiting for the other tabs…';
      const more = Math.max(0, w.min - Math.max(1, w.arrived));
      if (w.paused) {
        const at = s.lastStep ? ` at step ${fmtInt(s.lastStep.step)}` : '';
        return `Training is paused${at}: only ${plural(w.arrived, 'tab')} ${w.arrived === 1 ? 'is' : 'are'} left, below the minimum of ${w.min}. It resumes when ${plural(more, 'more tab')} ${more === 1 ? 'joins' : 'join'}. Share the link below.${lostNote}`;
      }
      // This tab is one of the session's members, so at least one is here whatever a count says.
      const arrived = Math.max(1, w.arrived);
      const here =
        w.min === w.max ? `${arrived} of ${w.max} here` : `${arrived} here; training starts with ${w.min}, up to ${w.max} can join`;
      return `Waiting for ${plural(more, 'more tab')} (${here}). Share the link below.`;
    }
    case 'starting': {
      const n = s.worldSize ?? s.waiting?.arrived;
      const max = s.waiting?.max ?? s.config?.max;
      const next = 'Connecting the ring and loading data…';
      if (n === undefined) return `Starting. ${next}`;
      if (max !== undefined && n < max) return `${plural(n, 'tab')} joined, enough to start (up to ${max} can train together). ${next}`;
      return `${n === 1 ? 'The only tab' : `All ${n} tabs`} joined. ${next}`;
    }
    case 'training': {
      const e = s.lastStep;
      const evaluating = finalEvalText(s);
      if (evaluating !== null)
        return `Training finished at step ${fmtInt(s.finalEval!.step)}. ${evaluating} The model can be downloaded now.`;
      const w = s.worldSize ?? 0;
      return `Training${e ? ` (epoch ${epochOf(s, e.epoch)})` : ''} on ${w || '?'} rank${w === 1 ? '' : 's'}.${lostNote}`;
    }
    case 'done': {
      if (s.endedWithoutRank !== null) {
        return `The run finished without this tab: its last round failed here (rank ${s.endedWithoutRank}) while the other tabs finished it${s.lastStep ? `, after ${fmtInt(s.lastStep.step)} steps` : ''}. The final model is theirs; this tab's replica, from its last committed step, can be downloaded.`;
      }
      if (s.self === null)
        return `The run finished before this tab got a rank${s.lastStep ? `, after ${fmtInt(s.lastStep.step)} steps` : ''}: it trained without this tab. To train, ask the host for a new session.`;
      const final = finalTestAccuracy(s);
      const acc = evalSkipped(s) ? ' The evaluation was skipped.' : final !== null ? ` Final test accuracy ${fmtPercent(final)}.` : '';
      const took = runSeconds(s);
      const steps = s.lastStep ? ` ${fmtInt(s.lastStep.step)} steps in ${fmtDuration(took ?? s.lastStep.elapsedSec)}.` : '';
      return `Done.${steps}${acc} The model can be downloaded.`;
    }
    case 'failed': {
      const more = s.canContinue ? ' The model trained so far is kept: you can continue training.' : '';
      return `Training failed${s.lastStep ? ` at step ${fmtInt(s.lastStep.step)}` : ''}: ${failureReason(s)}.${more}`;
    }
    case 'stopped': {
      const by = s.stoppedBy;
      if (!by) return 'Stopped.';
      const who = s.stoppedByHost ? 'the host' : by.by === s.self ? `rank ${by.by} (this tab)` : `rank ${by.by}`;
      const final = finalTestAccuracy(s);
      const evaluating = finalEvalText(s);
      const acc = evalSkipped(s) ? ' The evaluation was skipped.' : final !== null ? ` Test accuracy ${fmtPercent(final)}.` : '';
      const after = s.finished
        ? `${acc} The model trained so far can be downloaded.`
        : controls(s).downloadEnabled
          ? ` The model trained so far can be downloaded now.${evaluating !== null ? ` ${evaluating}` : ''}`
          : '';
      return `Stopped by ${who} at step ${fmtInt(by.atStep)}.${lostNote}${after}`;
    }
    case 'full': {
      const n = s.fullRanks;
      return `The session is full${n !== null ? `: all ${plural(n, 'rank')} are taken` : ''}, so this tab is not training. Keep it for when a tab closes (reload it then), or create a new session.`;
    }
    case 'removed': {
      const at = s.lastStep ? ` at step ${fmtInt(s.lastStep.step)}` : '';
      const model = controls(s).downloadEnabled ? " This tab's replica, from its last committed step, can still be downloaded." : '';
      return `The host removed this tab from the session${at}: it stopped training, and its link no longer opens the session.${model}`;
    }
    case 'ended': {
      const at = s.lastStep ? ` at step ${fmtInt(s.lastStep.step)}` : '';
      const model = controls(s).downloadEnabled ? ' The model trained so far can still be downloaded from this tab.' : '';
      return `The host ended the session${at}: this tab is disconnected.${model}`;
    }
  }
}
