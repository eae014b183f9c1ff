/** The ring card: the ring all-reduce picture (ring_view.ts) drawn from the ring card's model. */
import type { DashboardState } from './dashboard_state.ts';
import { ringModel } from './dashboard_ring.ts';
import { el } from './dom.ts';
import { RingView } from './ring_view.ts';
import { changeDetector } from './view_dom.ts';
import './styles/panel_ring.css';

/** The ring all-reduce picture, redrawn when its inputs change. */
export class RingCardView {
  readonly node: HTMLElement;
  private readonly ring = new RingView();
  private readonly changed = changeDetector();

  constructor() {
    this.node = el(
      'section',
      { class: 'card ring-card', 'aria-labelledby': 'ring-title' },
      el('h2', { id: 'ring-title', class: 'card-title' }, 'Ring all-reduce'),
      this.ring.element,
    );
  }

  render(s: DashboardState): void {
    if (this.changed([s.worldSize, s.config, s.self, s.joined, s.lost, s.links, s.ringProven, s.phase === 'training']))
      this.ring.update(ringModel(s));
  }
}
