/** The progress card: the progress bar, its text and its test hooks. */
import type { DashboardState } from './dashboard_state.ts';
import { progressFigures } from './dashboard_progress.ts';
import { el } from './dom.ts';
import { setText } from './view_dom.ts';
import './styles/panel_progress.css';

/** The progress bar, its text, and the test hooks data-step / data-total / data-done. */
export class ProgressView {
  readonly node: HTMLElement;
  private readonly bar: HTMLProgressElement;
  private readonly text: HTMLElement;

  constructor() {
    this.bar = el('progress', { id: 'dash-progress', max: 1, value: 0, 'aria-describedby': 'dash-progress-text' });
    this.text = el('p', { id: 'dash-progress-text', class: 'progress-text' });
    this.node = el(
      'section',
      {
        class: 'card progress-card',
        'data-testid': 'progress',
        'data-step': 0,
        'data-total': 0,
        'data-done': 'false',
        'aria-labelledby': 'dash-progress-label',
      },
      el('label', { id: 'dash-progress-label', for: 'dash-progress', class: 'card-title' }, 'Progress'),
      this.bar,
      this.text,
    );
  }

  render(s: DashboardState): void {
    const p = progressFigures(s);
    this.bar.max = p.max;
    this.bar.value = p.value;
    this.node.dataset.step = String(p.step);
    this.node.dataset.total = String(p.total);
    this.node.dataset.done = String(p.done);
    this.node.dataset.state = s.phase;
    setText(this.text, p.text);
  }
}
