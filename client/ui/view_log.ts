/** The event log card, newest first. */
import { MAX_LOG, type DashboardState, type LogEntry } from './dashboard_state.ts';
import { el } from './dom.ts';
import { fmtClock } from './format.ts';
import './styles/panel_log.css';

/** The event log, newest first; only entries it has not drawn yet are added. */
export class LogView {
  readonly node: HTMLElement;
  private readonly list: HTMLOListElement;
  /** Id of the first entry not drawn yet. */
  private drawnUpTo = 0;

  constructor() {
    this.list = el('ol', {
      class: 'event-log',
      'data-testid': 'event-log',
      role: 'log',
      'aria-live': 'polite',
      'aria-labelledby': 'log-title',
      tabindex: 0,
    });
    this.node = el(
      'section',
      { class: 'card log-card', 'aria-labelledby': 'log-title' },
      el('h2', { id: 'log-title', class: 'card-title' }, 'Event log', el('span', { class: 'card-note' }, ' · newest first')),
      this.list,
    );
  }

  render(s: DashboardState): void {
    const fresh: LogEntry[] = [];
    for (const entry of s.log) {
      if (entry.id < this.drawnUpTo) break;
      fresh.push(entry);
    }
    if (fresh.length === 0) return;
    // Oldest of the new ones first, each on top of the list.
    for (const entry of fresh.reverse()) {
      const at = new Date(entry.at);
      this.list.prepend(
        el(
          'li',
          { class: `log-entry level-${entry.level}`, 'data-level': entry.level },
          el('time', { datetime: at.toISOString() }, fmtClock(at)),
          el('span', { class: 'log-level' }, entry.level === 'info' ? 'info' : entry.level === 'warn' ? 'warning' : 'error'),
          el('span', { class: 'log-msg' }, entry.message),
        ),
      );
    }
    this.drawnUpTo = s.nextLogId;
    while (this.list.childElementCount > MAX_LOG) this.list.lastElementChild?.remove();
  }
}
