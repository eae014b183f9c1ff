/** The fleet card: a table row per rank with its browser, backend, device, step time and share of the global batch; the host's "Remove" on the others. */
import { RECENT, type DashboardState } from './dashboard_state.ts';
import { fleetRows, type FleetRow } from './dashboard_fleet.ts';
import { contributionCells, showsContributions, type ContributionCell } from './dashboard_contrib.ts';
import { controls, removeConfirm } from './dashboard_controls.ts';
import { el, rankColour } from './dom.ts';
import { fmtMs, fmtPercent } from './format.ts';
import { changeDetector, setText } from './view_dom.ts';
import './styles/panel_shared.css';
import './styles/panel_fleet.css';

/**
 * The fleet: every rank's browser, backend and device, its time per step and its share of the
 * global batch (drawn on the throttled render). The browser, device and fallback texts come from
 * other tabs: they are cleaned and capped before they get here, and only ever set as text.
 */
export class FleetView {
  readonly node: HTMLElement;
  private readonly body: HTMLTableSectionElement;
  private readonly note: HTMLElement;
  /** The "Contribution" column's head: shown only for a robust aggregation. */
  private readonly contributionHead: HTMLTableCellElement;
  private readonly changed = changeDetector();
  private readonly removeDialog: RemoveDialog;
  /**
   * The "Remove" button of each rank, kept across redraws: the rows are rebuilt several times a
   * second while training, and a click must land on the button it started on.
   */
  private readonly removeButtons = new Map<number, HTMLButtonElement>();
  /** The server's round of the ranks the table shows (a removal names a rank of that round only). */
  private round: number | null = null;

  /** `onRemove`: the host confirmed removing the tab at `rank` of round `round`, as the table showed them. */
  constructor(onRemove: (target: { rank: number; round: number }) => void = () => {}) {
    this.removeDialog = new RemoveDialog(onRemove);
    this.body = el('tbody');
    this.note = el('p', { class: 'card-note', 'data-testid': 'fleet-note' });
    const col = (text: string, cls = '') => el('th', { scope: 'col', ...(cls ? { class: cls } : {}) }, text);
    this.contributionHead = el(
      'th',
      { scope: 'col', title: "What the group's robust aggregation judged of each rank's contributions over this group's steps" },
      'Contribution',
    );
    this.contributionHead.hidden = true;
    const table = el(
      'table',
      { class: 'perf-table fleet-table', 'data-testid': 'fleet-table', 'aria-describedby': 'fleet-note' },
      el('caption', { class: 'visually-hidden' }, "Each rank's browser, backend, device, time per step and share of the global batch"),
      el(
        'thead',
        {},
        el(
          'tr',
          {},
          col('Rank'),
          col('Browser'),
          col('Backend'),
          col('Device'),
          col('Step time', 'num'),
          col('Share of batch', 'num'),
          this.contributionHead,
        ),
      ),
      this.body,
    );
    this.note.id = 'fleet-note';
    this.node = el(
      'section',
      { class: 'card fleet-card', 'aria-labelledby': 'fleet-title' },
      el('h2', { id: 'fleet-title', class: 'card-title' }, 'The group’s tabs'),
      el('div', { class: 'table-scroll' }, table),
      this.note,
      this.removeDialog.node,
    );
    this.node.hidden = true;
  }

  render(s: DashboardState): void {
    if (
      !this.changed([
        s.fleet,
        s.recent,
        s.lastStep,
        s.self,
        s.lost,
        s.worldSize,
        s.backend,
        s.config,
        s.role,
        s.phase,
        s.round,
        s.contributions,
      ])
    )
      return;
    const rows = fleetRows(s);
    this.node.hidden = rows.length === 0;
    const removable = controls(s).remove.visible;
    this.round = s.round;
    const offered = rows.filter((row) => removable && !row.self && !row.lost).map((row) => row.rank);
    for (const rank of this.removeButtons.keys()) if (!offered.includes(rank)) this.removeButtons.delete(rank);
    const robust = showsContributions(s);
    this.contributionHead.hidden = !robust;
    const cells = robust ? contributionCells(s) : null;
    this.body.replaceChildren(...rows.map((row) => fleetRow(row, offered.includes(row.rank) ? this.removeButton(row.rank) : null, cells)));
    const even = rows.some((r) => r.shareEven);
    const judged = robust
      ? ' Contribution: its last norm against the median of the group’s, the share of its values trimmed (or its clip scale), the steps refused; hover for more.'
      : '';
    setText(
      this.note,
      `Step time and share of the global batch over the last ${RECENT} steps${even ? '; the ranks train equal batches' : ''}. Browser and device are as each tab reports itself.${judged}`,
    );
  }

  /** The "Remove" button of `rank` (made once, then moved from row to row as the table redraws). */
  private removeButton(rank: number): HTMLButtonElement {
    let button = this.removeButtons.get(rank);
    if (!button) {
      button = el(
        'button',
        {
          type: 'button',
          class: 'btn btn-danger fleet-remove',
          'data-testid': `remove-rank-${rank}`,
          'aria-haspopup': 'dialog',
          'aria-label': `Remove rank ${rank} from the session`,
        },
        'Remove',
      );
      button.addEventListener('click', () => {
        if (this.round !== null) this.removeDialog.open({ rank, round: this.round });
      });
      this.removeButtons.set(rank, button);
    }
    return button;
  }
}

/** The host's confirmation before a tab is removed: Cancel is focused first, so a stray Enter does nothing. */
class RemoveDialog {
  readonly node: HTMLDialogElement;
  private readonly title = el('h2', { id: 'remove-dialog-title' });
  private readonly body = el('p', { id: 'remove-dialog-body' });
  private readonly confirm = el('button', { value: 'confirm', class: 'btn btn-danger-solid', 'data-testid': 'remove-confirm' });
  private target: { rank: number; round: number } | null = null;

  constructor(onRemove: (target: { rank: number; round: number }) => void) {
    this.node = el(
      'dialog',
      {
        class: 'confirm-dialog',
        'aria-labelledby': 'remove-dialog-title',
        'aria-describedby': 'remove-dialog-body',
        'data-testid': 'remove-dialog',
      },
      el(
        'form',
        { method: 'dialog' },
        this.title,
        this.body,
        el(
          'div',
          { class: 'dialog-actions' },
          el('button', { value: 'cancel', class: 'btn btn-secondary', autofocus: true }, 'Cancel'),
          this.confirm,
        ),
      ),
    );
    this.node.addEventListener('close', () => {
      if (this.node.returnValue === 'confirm' && this.target) onRemove(this.target);
    });
  }

  /** Asks about the tab at `rank` of `round`: a later round's rank may be another tab, and the server then refuses. */
  open(target: { rank: number; round: number }): void {
    const text = removeConfirm(target.rank);
    this.target = target;
    setText(this.title, text.title);
    setText(this.body, text.body);
    setText(this.confirm, text.confirm);
    this.node.returnValue = '';
    if (!this.node.open) this.node.showModal();
  }
}

/** A rank's row; `removeButton` (the host's tab, another rank): its "Remove", which opens the confirmation; `cells`: the Contribution column's (robust runs). */
function fleetRow(
  row: FleetRow,
  removeButton: HTMLButtonElement | null,
  cells: ReadonlyMap<number, ContributionCell> | null,
): HTMLTableRowElement {
  const unknown = (text: string) => el('span', { class: 'muted' }, text);
  const backend: Array<Node | string> = row.backend ? [el('strong', {}, row.backend)] : [unknown('–')];
  if (row.fallback) backend.push(el('span', { class: 'fallback', 'data-testid': 'fleet-fallback' }, `⚠ fallback: ${row.fallback}`));
  const share = row.share === null ? '–' : fmtPercent(row.share, row.share < 0.1 ? 1 : 0);
  return el(
    'tr',
    { class: `${row.self ? 'self-row' : ''}${row.lost ? ' lost-row' : ''}`, 'data-rank': row.rank },
    el(
      'th',
      { scope: 'row' },
      el('span', { class: 'rank-swatch', style: `background:${rankColour(row.rank)}` }),
      `rank ${row.rank}`,
      row.self ? el('span', { class: 'you' }, ' (this tab)') : '',
      ...(removeButton ? [removeButton] : []),
    ),
    el(
      'td',
      { class: 'fleet-browser', 'data-col': 'browser', 'data-label': 'Browser' },
      ...(row.browser
        ? [row.browser, ...(row.platform ? [el('span', { class: 'fleet-sub' }, row.platform)] : [])]
        : [unknown('not reported yet')]),
    ),
    el('td', { class: 'fleet-backend', 'data-col': 'backend', 'data-label': 'Backend' }, ...backend),
    el(
      'td',
      { class: 'fleet-device', 'data-col': 'device', 'data-label': 'Device' },
      row.device ? el('span', { class: 'fleet-device-text' }, row.device) : unknown('–'),
    ),
    el(
      'td',
      { class: 'num', 'data-col': 'step', 'data-label': 'Step time' },
      row.stepMs === null ? '–' : fmtMs(row.stepMs),
      ...(row.computeMs !== null && row.stepMs !== null ? [el('span', { class: 'fleet-sub' }, `compute ${fmtMs(row.computeMs)}`)] : []),
    ),
    el(
      'td',
      { class: 'num', 'data-col': 'share', 'data-unit': 'of the batch' },
      el('span', { class: 'fleet-share', 'data-testid': 'fleet-share' }, share),
      ...(row.idle ? [el('span', { class: 'fleet-sub fleet-idle', 'data-testid': 'fleet-no-samples' }, row.idle)] : []),
    ),
    ...(cells ? [contributionTd(cells.get(row.rank))] : []),
  );
}

/** The Contribution cell: its text, a warning style when the rank's norm is far off or it was refused, and the figures in words on hover. */
function contributionTd(cell: ContributionCell | undefined): HTMLTableCellElement {
  if (!cell)
    return el(
      'td',
      {
        class: 'fleet-contribution',
        'data-col': 'contribution',
        'data-label': 'Contribution',
        title: 'No aggregation has judged this rank yet',
      },
      el('span', { class: 'muted' }, '–'),
    );
  return el(
    'td',
    {
      class: `fleet-contribution${cell.warn ? ' contribution-warn' : ''}`,
      'data-col': 'contribution',
      'data-label': 'Contribution',
      'data-testid': 'fleet-contribution',
      title: cell.title,
    },
    `${cell.warn ? '⚠ ' : ''}${cell.text}`,
  );
}
