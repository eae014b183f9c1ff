/** Each tab's own pictures (dataset local): the group's accuracy on every tab's held-out pictures, this tab's, and a row per tab. */
import type { DashboardState } from './dashboard_state.ts';
import { localFigures } from './dashboard_local.ts';
import { el } from './dom.ts';
import { fmtInt } from './format.ts';
import { changeDetector, setText } from './view_dom.ts';
import './styles/panel_shared.css';

export class LocalView {
  readonly node: HTMLElement;
  private readonly changed = changeDetector();
  private readonly group = el('p', { class: 'local-group', 'data-testid': 'local-group-accuracy' });
  private readonly own = el('p', { class: 'local-own', 'data-testid': 'local-own-accuracy' });
  private readonly body = el('tbody', {});

  constructor() {
    this.node = el(
      'section',
      { class: 'card local-card', hidden: true, 'aria-labelledby': 'local-title', 'data-testid': 'local-accuracy' },
      el('h2', { id: 'local-title', class: 'card-title' }, 'Accuracy on each tab’s own test pictures'),
      this.group,
      this.own,
      el(
        'table',
        { class: 'local-table', 'data-testid': 'local-table' },
        el(
          'thead',
          {},
          el(
            'tr',
            {},
            el('th', { scope: 'col' }, 'Tab'),
            el('th', { scope: 'col' }, 'Pictures to train'),
            el('th', { scope: 'col' }, 'Test accuracy'),
          ),
        ),
        this.body,
      ),
      el(
        'p',
        { class: 'card-note' },
        'Every tab tests the model on its own held-out pictures; only the counts travel. The group’s figure counts every tab’s test pictures once.',
      ),
    );
  }

  render(s: DashboardState): void {
    if (!this.changed([s.local, s.self])) return;
    const f = localFigures(s);
    this.node.hidden = f === null;
    if (!f) return;
    setText(this.group, `The group: ${f.group}${f.step === null ? '' : ` at step ${fmtInt(f.step)}`}`);
    setText(this.own, `This tab: ${f.own}`);
    this.body.replaceChildren(
      ...f.rows.map((r) =>
        el(
          'tr',
          { 'data-rank': r.rank },
          el('td', {}, `rank ${r.rank}${r.self ? ' (this tab)' : ''}`),
          el('td', {}, r.pictures === null ? '–' : fmtInt(r.pictures)),
          el('td', {}, r.accuracy),
        ),
      ),
    );
  }
}
