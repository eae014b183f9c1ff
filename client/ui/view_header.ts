/** The dashboard's header: title, phase pill, the session's controls with their confirmation dialogs, and the status line. */
import type { DashboardState } from './dashboard_state.ts';
import { CONFIRM, controls } from './dashboard_controls.ts';
import { displayPhase, phaseLabel, statusText } from './dashboard_status.ts';
import { el } from './dom.ts';
import { setText } from './view_dom.ts';
import './styles/panel_header.css';

export interface HeaderActions {
  /** Confirmed in a dialog first. */
  stop(): void;
  /** Confirmed in a dialog first. */
  end(): void;
  setMin(min: number): void;
  download(): void;
  /** The model for PyTorch: a safetensors state dict and its nn.Module in a .py file. */
  downloadTorch(): void;
  continueTraining(): void;
  /** "Skip the evaluation" after the run (no dialog: the weights are kept either way). */
  skipEval(): void;
}

/**
 * A native modal dialog that says what will happen, with Cancel focused first so a stray Enter
 * does nothing; `onConfirm` runs only when the person chose the action.
 */
function confirmDialog(kind: keyof typeof CONFIRM, onConfirm: () => void): { dialog: HTMLDialogElement; open(): void } {
  const text = CONFIRM[kind];
  const dialog = el(
    'dialog',
    {
      class: 'confirm-dialog',
      'aria-labelledby': `${kind}-dialog-title`,
      'aria-describedby': `${kind}-dialog-body`,
      'data-testid': `${kind}-dialog`,
    },
    el(
      'form',
      { method: 'dialog' },
      el('h2', { id: `${kind}-dialog-title` }, text.title),
      el('p', { id: `${kind}-dialog-body` }, text.body),
      el(
        'div',
        { class: 'dialog-actions' },
        el('button', { value: 'cancel', class: 'btn btn-secondary', autofocus: true }, 'Cancel'),
        el('button', { value: 'confirm', class: 'btn btn-danger-solid', 'data-testid': `${kind}-confirm` }, text.confirm),
      ),
    ),
  );
  dialog.addEventListener('close', () => {
    if (dialog.returnValue === 'confirm') onConfirm();
  });
  return {
    dialog,
    open: () => {
      dialog.returnValue = '';
      if (!dialog.open) dialog.showModal();
    },
  };
}

/** The host's control of the minimum number of tabs: a form whose input is checked (1..its max) before `setMin` is called. */
function minimumControl(setMin: (n: number) => void): { group: HTMLElement; input: HTMLInputElement } {
  const input = el('input', {
    id: 'dash-min',
    type: 'number',
    min: 1,
    step: 1,
    inputmode: 'numeric',
    'data-testid': 'min-input',
    'aria-describedby': 'dash-min-hint dash-min-error',
  });
  const error = el('p', { id: 'dash-min-error', class: 'field-error', role: 'alert' });
  const setButton = el('button', { type: 'submit', class: 'btn btn-secondary', 'data-testid': 'min-set' }, 'Set');
  const group = el(
    'form',
    { class: 'host-controls', 'aria-label': 'Host controls', hidden: true, novalidate: true },
    el('label', { for: 'dash-min' }, 'Keep training with at least'),
    input,
    el('span', { 'aria-hidden': 'true' }, 'tabs'),
    setButton,
    el(
      'p',
      { id: 'dash-min-hint', class: 'field-hint' },
      'Tabs may close, reload or join: training goes on while at least this many are in.',
    ),
    error,
  );
  group.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const max = Number(input.max);
    const n = Number(input.value);
    if (!Number.isInteger(n) || n < 1 || n > max) {
      error.textContent = `Enter a whole number from 1 to ${max}.`;
      input.setAttribute('aria-invalid', 'true');
      return;
    }
    error.textContent = '';
    input.removeAttribute('aria-invalid');
    setMin(n);
  });
  return { group, input };
}

/** Title, phase pill, the session's controls (as this tab's role allows), and the status line. */
export class HeaderView {
  readonly node: HTMLElement;
  private readonly status: HTMLElement;
  private readonly pill: HTMLElement;
  private readonly stop: HTMLButtonElement;
  private readonly end: HTMLButtonElement;
  private readonly skipEval: HTMLButtonElement;
  private readonly continueButton: HTMLButtonElement;
  private readonly download: HTMLButtonElement;
  private readonly downloadTorch: HTMLButtonElement;
  private readonly downloadHint: HTMLElement;
  private readonly minGroup: HTMLElement;
  private readonly minInput: HTMLInputElement;
  private readonly note: HTMLElement;

  constructor(session: string, on: HeaderActions) {
    this.status = el('p', { class: 'status-line', role: 'status', 'data-testid': 'status' });
    this.pill = el('span', { class: 'phase-pill', 'data-testid': 'phase-pill' });
    const stopDialog = confirmDialog('stop', on.stop);
    const endDialog = confirmDialog('end', on.end);
    this.stop = el('button', { type: 'button', class: 'btn btn-danger', 'data-testid': 'stop-button', 'aria-haspopup': 'dialog' });
    this.end = el(
      'button',
      { type: 'button', class: 'btn btn-danger', 'data-testid': 'end-button', 'aria-haspopup': 'dialog', hidden: true },
      'End session',
    );
    this.skipEval = el(
      'button',
      { type: 'button', class: 'btn btn-secondary', 'data-testid': 'skip-eval-button', hidden: true },
      'Skip the evaluation',
    );
    this.skipEval.addEventListener('click', on.skipEval);
    this.continueButton = el(
      'button',
      { type: 'button', class: 'btn btn-primary', 'data-testid': 'continue-button', hidden: true },
      'Continue training',
    );
    this.download = el(
      'button',
      { type: 'button', class: 'btn btn-primary', 'data-testid': 'download-button', disabled: true, 'aria-describedby': 'download-hint' },
      'Download model',
    );
    this.downloadTorch = el(
      'button',
      {
        type: 'button',
        class: 'btn btn-secondary',
        'data-testid': 'download-torch-button',
        disabled: true,
        'aria-describedby': 'download-hint',
      },
      'For PyTorch',
    );
    this.downloadHint = el('p', { id: 'download-hint', class: 'visually-hidden' }, 'Available once training stops or ends.');
    this.stop.addEventListener('click', stopDialog.open);
    this.end.addEventListener('click', endDialog.open);
    this.continueButton.addEventListener('click', on.continueTraining);
    this.download.addEventListener('click', on.download);
    this.downloadTorch.addEventListener('click', on.downloadTorch);

    // The host's control of the minimum: typed, then applied with the button (or Enter).
    ({ group: this.minGroup, input: this.minInput } = minimumControl((n) => on.setMin(n)));
    this.note = el('p', { class: 'role-note', 'data-testid': 'role-note', hidden: true });

    this.node = el(
      'header',
      { class: 'dash-header' },
      el(
        'div',
        { class: 'title-row' },
        el('h1', {}, el('span', { class: 'title-kicker' }, 'Session '), el('span', { class: 'session-name' }, session)),
        this.pill,
        el('div', { class: 'actions' }, this.continueButton, this.stop, this.skipEval, this.end, this.download, this.downloadTorch),
      ),
      this.minGroup,
      this.note,
      this.status,
      this.downloadHint,
      stopDialog.dialog,
      endDialog.dialog,
    );
  }

  render(s: DashboardState): void {
    setText(this.status, statusText(s));
    const phase = displayPhase(s);
    if (this.pill.dataset.phase !== phase) this.pill.dataset.phase = phase;
    setText(this.pill, phaseLabel(s));
    const c = controls(s);
    this.stop.hidden = !c.stop.visible;
    this.stop.disabled = c.stop.disabled;
    setText(this.stop, c.stop.label);
    this.skipEval.hidden = !c.skipEval.visible;
    this.skipEval.disabled = c.skipEval.disabled;
    setText(this.skipEval, c.skipEval.label);
    this.end.hidden = !c.end.visible;
    this.end.disabled = c.end.disabled;
    this.continueButton.hidden = !c.continueVisible;
    this.download.disabled = !c.downloadEnabled;
    this.downloadTorch.disabled = !c.downloadEnabled;
    setText(
      this.downloadHint,
      c.downloadEnabled
        ? 'Download model saves it for TF.js, as two files named after the session and step: <session>-step-<n>.json and its .weights.bin. For PyTorch saves <session>_step_<n>.safetensors (a torch state dict) and <session>_step_<n>.py (the nn.Module that loads it).'
        : 'Available once training stops or ends.',
    );
    this.minGroup.hidden = !c.min.visible;
    this.minInput.max = String(c.min.max);
    this.minInput.disabled = c.min.disabled;
    // Do not overwrite what the host is typing.
    if (document.activeElement !== this.minInput && this.minInput.value !== String(c.min.value)) this.minInput.value = String(c.min.value);
    this.note.hidden = c.note === null;
    setText(this.note, c.note ?? '');
  }
}
