/** The stat cards: the five latest figures above the charts. */
import type { DashboardState } from './dashboard_state.ts';
import { statCards, timeCard, type StatCard, type StatKey } from './dashboard_cards.ts';
import { el } from './dom.ts';
import { setText } from './view_dom.ts';
import './styles/panel_cards.css';

const STAT_LABEL: Record<StatKey, string> = {
  loss: 'Train loss',
  acc: 'Train accuracy',
  test: 'Test accuracy',
  speed: 'Throughput',
  time: 'Time',
};
const STAT_ORDER: readonly StatKey[] = ['loss', 'acc', 'test', 'speed', 'time'];

/** The five latest figures (drawn on the throttled render). */
export class StatsView {
  readonly node: HTMLElement;
  private readonly cards = new Map<StatKey, { value: HTMLElement; sub: HTMLElement }>();

  constructor() {
    this.node = el('section', { class: 'stats', 'aria-label': 'Latest figures' });
    for (const key of STAT_ORDER) {
      const value = el('p', { class: 'stat-value' }, '–');
      const sub = el('p', { class: 'stat-sub' }, '');
      this.cards.set(key, { value, sub });
      this.node.append(el('div', { class: 'stat', 'data-stat': key }, el('p', { class: 'stat-label' }, STAT_LABEL[key]), value, sub));
    }
  }

  /** The four figures that redraw on the throttled render. */
  render(s: DashboardState): void {
    const figures = statCards(s);
    for (const [key, card] of this.cards) if (key !== 'time') this.draw(card, figures[key]);
  }

  /** The TIME card, drawn with the Progress panel (each frame): its time left is the panel's, never an older one. */
  renderTime(s: DashboardState): void {
    this.draw(this.cards.get('time')!, timeCard(s));
  }

  private draw(card: { value: HTMLElement; sub: HTMLElement }, f: StatCard): void {
    if (f.unit) card.value.replaceChildren(f.value, el('span', { class: 'unit' }, f.unit));
    else setText(card.value, f.value);
    setText(card.sub, f.sub);
  }
}
