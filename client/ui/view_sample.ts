/** A language model's latest sampled text ('sample' events): what the model writes after the prompt, and at which step. */
import type { DashboardState } from './dashboard_state.ts';
import { el } from './dom.ts';
import { changeDetector, setText } from './view_dom.ts';
import { fmtInt } from './format.ts';
import './styles/panel_shared.css';
import './styles/panel_sample.css';

export class SampleView {
  readonly node: HTMLElement;
  private readonly changed = changeDetector();
  private readonly when: HTMLElement;
  private readonly prompt: HTMLElement;
  private readonly text: HTMLElement;

  constructor() {
    this.when = el('p', { class: 'sample-when' });
    // The prompt set apart from what the model added; both as text, never markup.
    this.prompt = el('span', { class: 'sample-prompt' });
    this.text = el('span', { class: 'sample-text' });
    this.node = el(
      'section',
      { class: 'card sample-card', hidden: true, 'aria-labelledby': 'sample-title', 'data-testid': 'sample' },
      el('h2', { id: 'sample-title', class: 'card-title' }, 'What the model writes'),
      this.when,
      el('p', { class: 'sample-body', 'data-testid': 'sample-text' }, this.prompt, this.text),
    );
  }

  render(s: DashboardState): void {
    if (!this.changed([s.lastSample])) return;
    const sample = s.lastSample;
    this.node.hidden = sample === null;
    if (!sample) return;
    setText(this.when, `After step ${fmtInt(sample.step)}, sampled at temperature 0.8:`);
    setText(this.prompt, sample.prompt);
    setText(this.text, sample.text);
  }
}
