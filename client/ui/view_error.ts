/** The error banner: what went wrong and what the person can do about it. */
import type { DashboardState } from './dashboard_state.ts';
import { el } from './dom.ts';
import { changeDetector } from './view_dom.ts';
import './styles/panel_error.css';

/** A prominent banner that says what went wrong and what the person can do about it. */
export class ErrorBannerView {
  readonly node: HTMLElement;
  private readonly changed = changeDetector();

  constructor(private readonly onDismiss: () => void) {
    this.node = el('div', { class: 'error-banner', role: 'alert', 'data-testid': 'error-banner', hidden: true });
  }

  render(s: DashboardState): void {
    const error = s.error;
    if (!this.changed([error])) return;
    if (!error) {
      this.node.hidden = true;
      this.node.replaceChildren();
      delete this.node.dataset.title;
      return;
    }
    const dismiss = el('button', { type: 'button', class: 'btn btn-quiet', 'aria-label': 'Dismiss this message' }, 'Dismiss');
    dismiss.addEventListener('click', this.onDismiss);
    const action = error.action ? [el('p', { class: 'error-action' }, el('strong', {}, 'What to do: '), error.action)] : [];
    this.node.replaceChildren(
      el('span', { class: 'error-icon', 'aria-hidden': 'true' }, '!'),
      el(
        'div',
        { class: 'error-body' },
        el('p', { class: 'error-title' }, error.title),
        el('p', { class: 'error-detail' }, error.detail),
        ...action,
      ),
      dismiss,
    );
    this.node.hidden = false;
    this.node.dataset.title = error.title;
  }
}
