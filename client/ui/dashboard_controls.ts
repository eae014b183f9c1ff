/**
 * The controls' model: which buttons a tab shows and whether they work, what the confirmation
 * dialogs say, and the downloaded files' name.
 */
import { isOver, type DashboardState } from './dashboard_state.ts';

export interface Controls {
  /** "Stop training for everyone": the host's tab, or every tab of a session without a host. */
  stop: { visible: boolean; disabled: boolean; label: string };
  /** "Skip the evaluation": while the evaluation after the run goes on, on the tabs that may stop the run. */
  skipEval: { visible: boolean; disabled: boolean; label: string };
  /** "End session": the host's tab only. */
  end: { visible: boolean; disabled: boolean };
  /** The host's control of the minimum number of tabs (1..max). */
  min: { visible: boolean; disabled: boolean; value: number; max: number };
  /** The host's "Remove" on each other tab of the group table, while its group (round) is known and the run goes on. */
  remove: { visible: boolean };
  /** Said instead of the buttons on tabs that are not the host's. */
  note: string | null;
  /** "Continue training" after a failure the page can train past. */
  continueVisible: boolean;
  /**
   * The model can be saved once its weights are final: at the stop or when the evaluation after
   * the run starts (not only at 'done'), or when the page says it has one (after a failure).
   */
  downloadEnabled: boolean;
}

export function controls(s: DashboardState): Controls {
  const { host, hasHost, spectator } = s.role;
  let stop = { visible: (host || !hasHost) && !spectator, disabled: false, label: 'Stop training for everyone' };
  if (s.finished) stop = { ...stop, disabled: true, label: s.phase === 'stopped' ? 'Stopped' : 'Training finished' };
  else if (s.stoppedBy) stop = { ...stop, disabled: true, label: 'Stopped' };
  else if (isOver(s.phase) || s.phase === 'full') stop = { ...stop, disabled: true };
  else if (s.stopRequested) stop = { ...stop, disabled: true, label: 'Stopping…' };
  const fe = s.finalEval;
  const skipEval = {
    visible:
      (host || !hasHost) && !spectator && fe !== null && !fe.skipped && !s.finished && (s.phase === 'training' || s.phase === 'stopped'),
    disabled: fe?.skipRequested === true,
    label: fe?.skipRequested ? 'Skipping the evaluation…' : 'Skip the evaluation',
  };
  const max = s.config?.max ?? s.waiting?.max ?? 1;
  const min = s.minRequested ?? s.waiting?.min ?? s.config?.min ?? 1;
  return {
    stop,
    skipEval,
    end: { visible: host, disabled: s.phase === 'ended' },
    min: { visible: host && max > 1, disabled: isOver(s.phase), value: Math.min(min, max), max },
    remove: { visible: host && !spectator && s.round !== null && s.self !== null && !isOver(s.phase) },
    note:
      !host && hasHost && s.phase !== 'ended' ? "The host's tab controls this session: it can stop the training or end the session." : null,
    continueVisible: s.phase === 'failed' && s.canContinue,
    downloadEnabled: s.downloadable ?? (s.finished || weightsFinal(s)),
  };
}

/** This tab's weights are final: its run stopped, or its evaluation after the run began (a spectator's are not its run's). */
export function weightsFinal(s: DashboardState): boolean {
  if (s.self === null || s.role.spectator) return false;
  return s.finalEval !== null || (s.stoppedBy !== null && s.phase === 'stopped');
}

/** What the confirmation dialogs say: what happens, before it happens. */
export const CONFIRM = {
  stop: {
    title: 'Stop training for everyone?',
    body: 'Every tab of the session stops at the same step. The model trained so far is kept, and every tab can download it. Training does not start again in this session.',
    confirm: 'Stop training',
  },
  end: {
    title: 'End the session?',
    body: 'Training stops and every tab is disconnected from the session; its link no longer works. Download the model first if you want to keep it.',
    confirm: 'End session',
  },
} as const;

/** What removing the tab at `rank` does, said before it happens (the group table's confirmation). */
export function removeConfirm(rank: number): { title: string; body: string; confirm: string } {
  return {
    title: `Remove rank ${rank} from the session?`,
    body: "That tab stops training and keeps what it trained; the other tabs train on without it. The session's link changes, so that the old one (which that tab has) no longer opens it: the tabs still in the session get the new link, and this tab shows it for anyone who joins later.",
    confirm: 'Remove tab',
  };
}

/** The downloaded files' name: the session and the step the model is at ("my-run-step-938"). */
export function downloadBaseName(s: DashboardState): string {
  const session = s.session.replace(/[^A-Za-z0-9_.-]/g, '_') || 'browser-ddp';
  const step = s.lastStep?.step ?? (typeof s.summary?.steps === 'number' ? s.summary.steps : 0);
  return `${session}-step-${step}`;
}
