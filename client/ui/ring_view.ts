/**
 * The ring all-reduce drawn as ranks on a circle. Rank r sends to r+1 and receives from r-1, so
 * the links are the circle's edges, with arrows in the direction chunks travel.
 *
 * A tab only observes its own two links ('link' events name a peer of this tab). The other links
 * are drawn as "not observed" until a step completes: a completed ring all-reduce means every link
 * carried data, so from then on they are shown as open (inferred, marked as such).
 */
import type { LinkPath } from '../../src/index.ts';
import { svg, rankColour } from './dom.ts';

type LinkState = 'connecting' | 'open' | 'closed' | 'unknown';

interface RingLink {
  from: number;
  to: number;
  state: LinkState;
  /** True when this tab saw the state in a 'link' event; false when inferred or unknown. */
  observed: boolean;
  throughputMBps?: number;
  path?: LinkPath;
}

/** What this tab saw of one of its own links. */
export interface LinkObservation {
  state: 'connecting' | 'open' | 'closed';
  throughputMBps?: number;
  /** Candidate types, round-trip time and rates on the wire (from the link's WebRTC stats). */
  path?: LinkPath;
}

export interface RingModel {
  worldSize: number;
  /** This tab's rank, once known. */
  self: number | null;
  joined: ReadonlySet<number>;
  lost: ReadonlySet<number>;
  /** Links observed by this tab, by peer rank. */
  observedLinks: ReadonlyMap<number, LinkObservation>;
  /** At least one step completed (so every ring link has carried data). */
  ringProven: boolean;
  /** Data is flowing right now: open links show dots. */
  active: boolean;
  /**
   * The last step seen: the dots move on by one place per step, so they move when data moved.
   * Not a CSS animation: one that never ends repaints the tab every frame (60 times a second,
   * in software on a machine without a GPU), and on a machine shared by many tabs that time
   * comes out of training (at 8 headless tabs on 2 cores it cost 2.9x the bare all-reduce).
   */
  step: number;
}

/** The ring's edges: r -> r+1 for every r; one edge for two ranks, none for one. */
function ringLinks(model: RingModel): RingLink[] {
  const n = model.worldSize;
  if (n < 2) return [];
  const links: RingLink[] = [];
  for (let from = 0; from < (n === 2 ? 1 : n); from++) {
    const to = (from + 1) % n;
    let link: RingLink = { from, to, state: 'unknown', observed: false };
    const peer = model.self === from ? to : model.self === to ? from : null;
    const seen = peer === null ? undefined : model.observedLinks.get(peer);
    if (seen)
      link = {
        from,
        to,
        state: seen.state,
        observed: true,
        throughputMBps: seen.throughputMBps,
        ...(seen.path ? { path: seen.path } : {}),
      };
    else if (model.ringProven) link.state = 'open';
    // A lost rank's links cannot carry anything, whatever was last seen.
    if (model.lost.has(from) || model.lost.has(to)) link = { ...link, state: 'closed' };
    links.push(link);
  }
  return links;
}

function linkLabel(l: RingLink): string {
  switch (l.state) {
    case 'open':
      return l.throughputMBps !== undefined ? `open · ${fmtMBps(l.throughputMBps)}` : l.observed ? 'open' : 'open (inferred)';
    case 'connecting':
      return 'connecting…';
    case 'closed':
      return '✕ closed';
    case 'unknown':
      return 'not observed';
  }
}

/** The path in a few characters for the drawing: "relay ↔ relay · 3 ms". */
export function pathLabel(p: LinkPath): string {
  const kind = p.local === p.remote ? (p.local ?? '?') : `${p.local ?? '?'} ↔ ${p.remote ?? '?'}`;
  return p.rttMs === null ? kind : `${kind} · ${p.rttMs < 10 ? p.rttMs.toFixed(1) : p.rttMs.toFixed(0)} ms`;
}

/** The path in full, for the link's tooltip and the screen-reader summary. */
function pathTitle(p: LinkPath): string {
  const rate = (v: number | null) => (v === null ? '…' : fmtMBps(v / 1e6));
  const where = (t: string | null) =>
    t === 'relay'
      ? 'relay (TURN)'
      : t === 'host'
        ? 'host (direct)'
        : t === 'srflx' || t === 'prflx'
          ? `${t} (through NAT)`
          : (t ?? 'unknown');
  return `path ${where(p.local)} here, ${where(p.remote)} at the peer${p.protocol ? `, ${p.protocol.toUpperCase()}` : ''}${p.rttMs === null ? '' : `, round trip ${p.rttMs} ms`}, on the wire ${rate(p.sentBytesPerSec)} out, ${rate(p.receivedBytesPerSec)} in`;
}

function fmtMBps(v: number): string {
  return `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)} MB/s`;
}

const W = 400;
const H = 300;
const CX = W / 2;
const CY = H / 2;
/** How far the dots of an open link move per step: a quarter of their spacing (panel_ring.css's dash array). */
const FLOW_STRIDE = 4;

export class RingView {
  readonly element: HTMLElement;
  private readonly svgEl: SVGSVGElement;
  private readonly summary: HTMLElement;
  private readonly selfNote: HTMLElement;

  constructor() {
    this.svgEl = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'ring-svg', role: 'img', 'aria-labelledby': 'ring-summary' });
    this.summary = document.createElement('p');
    this.summary.id = 'ring-summary';
    this.summary.className = 'visually-hidden';
    this.element = document.createElement('div');
    this.element.className = 'ring';
    this.element.dataset.testid = 'ring';
    this.selfNote = document.createElement('p');
    this.selfNote.className = 'ring-note';
    this.selfNote.setAttribute('aria-hidden', 'true');
    this.element.append(this.svgEl, this.summary, legend(), this.selfNote);
  }

  update(model: RingModel): void {
    this.selfNote.textContent = model.self === null ? '' : `Circled: this tab (rank ${model.self}). Arrows show which way data travels.`;
    const layout = ringLayout(model.worldSize);
    const linksG = svg('g', { class: 'ring-links' });
    const labelsG = svg('g', { class: 'ring-labels' });
    const links = ringLinks(model);
    for (const l of links) {
      linksG.append(linkGroup(l, layout, model));
      // With many ranks, label only what this tab saw or what is wrong; the legend covers the rest.
      if (layout.n <= 4 || l.observed || l.state === 'closed' || l.state === 'connecting') labelsG.append(...linkLabels(l, layout));
    }
    const nodesG = svg('g', { class: 'ring-nodes' });
    for (let r = 0; r < model.worldSize; r++) nodesG.append(nodeGroup(r, layout, model));
    this.svgEl.replaceChildren(arrowDefs(), linksG, nodesG, labelsG);

    const who = model.self === null ? '' : ` This tab is rank ${model.self}.`;
    const lost = model.lost.size ? ` Lost: rank ${[...model.lost].join(', ')}.` : '';
    const linkText = links
      .map((l) => `rank ${l.from} to ${l.to} ${linkLabel(l)}${l.path && l.state === 'open' ? `, ${pathTitle(l.path)}` : ''}`)
      .join('; ');
    this.summary.textContent = `Ring of ${model.worldSize} rank${model.worldSize === 1 ? '' : 's'}.${who}${lost}${linkText ? ` Links: ${linkText}.` : ''}`;
  }
}

/** Where the ranks sit: on a circle sized for their number, with dots that shrink as they crowd. */
interface RingLayout {
  n: number;
  radius: number;
  nodeR: number;
  /** Rank r's centre. */
  pos(r: number): { x: number; y: number };
}

function ringLayout(worldSize: number): RingLayout {
  const n = Math.max(worldSize, 1);
  const radius = n <= 2 ? 70 : n <= 4 ? 95 : 112;
  const nodeR = Math.max(9, Math.min(n <= 4 ? 22 : 18, (Math.PI * radius) / n - 8));
  const pos = (r: number) => {
    // Rank 0 at the top, then clockwise.
    const a = -Math.PI / 2 + (2 * Math.PI * r) / n;
    return { x: CX + radius * Math.cos(a), y: CY + radius * Math.sin(a) };
  };
  return { n, radius, nodeR, pos };
}

/** An arrowhead per link state. */
function arrowDefs(): SVGElement {
  return svg(
    'defs',
    {},
    ...(['open', 'connecting', 'closed', 'unknown'] as const).map((s) =>
      svg(
        'marker',
        {
          id: `arrow-${s}`,
          viewBox: '0 0 10 10',
          refX: 8,
          refY: 5,
          markerWidth: 6,
          markerHeight: 6,
          orient: 'auto-start-reverse',
          class: `arrow arrow-${s}`,
        },
        svg('path', { d: 'M0,0 L10,5 L0,10 z' }),
      ),
    ),
  );
}

/** A link's chord between the two ranks' dots, with its state, figures and path as data attributes; dots flow on an open link while the run is active. */
function linkGroup(l: RingLink, layout: RingLayout, model: RingModel): SVGElement {
  const a = layout.pos(l.from);
  const b = layout.pos(l.to);
  const dx = b.x - a.x;
  const dy = b.y - a.y;
  const len = Math.hypot(dx, dy) || 1;
  const ux = dx / len;
  const uy = dy / len;
  const gap = layout.nodeR + 4;
  const x1 = a.x + ux * gap;
  const y1 = a.y + uy * gap;
  const x2 = b.x - ux * gap;
  const y2 = b.y - uy * gap;
  const g = svg('g', {
    class: `ring-link link-${l.state}${l.observed ? '' : ' link-inferred'}`,
    'data-testid': 'ring-link',
    'data-from': l.from,
    'data-to': l.to,
    'data-state': l.state,
    'data-observed': l.observed,
    'data-throughput': l.throughputMBps,
    'data-local': l.path?.local ?? undefined,
    'data-remote': l.path?.remote ?? undefined,
    'data-rtt': l.path?.rttMs ?? undefined,
  });
  g.append(
    svg(
      'title',
      {},
      `rank ${l.from} → rank ${l.to}: ${linkLabel(l)}${l.path && l.state === 'open' ? `; ${pathTitle(l.path)}` : ''}${l.observed ? '' : ' (not a link of this tab)'}`,
    ),
    svg('line', {
      x1,
      y1,
      x2,
      y2,
      class: 'link-line',
      'marker-end': `url(#arrow-${l.state})`,
      // Two ranks exchange both ways over their single link.
      'marker-start': model.worldSize === 2 ? `url(#arrow-${l.state})` : undefined,
    }),
  );
  if (model.active && l.state === 'open')
    g.append(svg('line', { x1, y1, x2, y2, class: 'link-flow', 'stroke-dashoffset': -FLOW_STRIDE * (model.step % 4) }));
  return g;
}

/** A link's label just outside the chord's midpoint (outward from the centre), so it never sits on a node. */
function linkLabels(l: RingLink, layout: RingLayout): SVGElement[] {
  const a = layout.pos(l.from);
  const b = layout.pos(l.to);
  const mx = (a.x + b.x) / 2;
  const my = (a.y + b.y) / 2;
  let ox = mx - CX;
  let oy = my - CY;
  const olen = Math.hypot(ox, oy);
  if (olen < 1) {
    // Two ranks: the chord passes through the centre; put the label beside it.
    ox = 1;
    oy = 0;
  } else {
    ox /= olen;
    oy /= olen;
  }
  const off = olen < 1 ? 10 : 12;
  const lx = mx + ox * off;
  const ly = my + oy * off;
  const anchor = Math.abs(ox) < 0.3 ? 'middle' : ox > 0 ? 'start' : 'end';
  const labels = [svg('text', { x: lx, y: ly + 4, 'text-anchor': anchor, class: `link-label label-${l.state}` }, linkLabel(l))];
  // The path on a second line: which way the bytes go is what a person debugging a slow ring asks first.
  if (l.path && l.state === 'open') {
    labels.push(
      svg(
        'text',
        { x: lx, y: ly + 17, 'text-anchor': anchor, class: 'link-label link-path', 'data-testid': 'ring-link-path' },
        pathLabel(l.path),
      ),
    );
  }
  return labels;
}

/** Rank r's dot: its number, its state (joined, waiting, lost), and a halo when it is this tab. */
function nodeGroup(r: number, layout: RingLayout, model: RingModel): SVGElement {
  const { n, radius, nodeR } = layout;
  const p = layout.pos(r);
  const state = model.lost.has(r) ? 'lost' : model.joined.has(r) || model.ringProven ? 'joined' : 'waiting';
  const isSelf = model.self === r;
  const g = svg('g', {
    class: `ring-node node-${state}${isSelf ? ' node-self' : ''}`,
    'data-testid': 'ring-node',
    'data-rank': r,
    'data-state': state,
    'data-self': isSelf,
    style: `--rank-colour: ${rankColour(r)}`,
  });
  const caption = isSelf ? 'this tab' : state === 'joined' ? '' : state;
  g.append(svg('title', {}, `rank ${r}${isSelf ? ' (this tab)' : ''}: ${state}`));
  if (isSelf) g.append(svg('circle', { cx: p.x, cy: p.y, r: nodeR + 5, class: 'self-halo' }));
  g.append(svg('circle', { cx: p.x, cy: p.y, r: nodeR, class: 'node-dot' }));
  g.append(svg('text', { x: p.x, y: p.y + 5, 'text-anchor': 'middle', class: 'node-num' }, String(r)));
  if (caption && (n <= 5 || !isSelf)) {
    // Caption outside the circle, away from the centre.
    const dirx = (p.x - CX) / radius;
    const diry = (p.y - CY) / radius;
    const cy = p.y + diry * (nodeR + 16) + 4;
    const cx = p.x + dirx * (nodeR + 16);
    const anchor = Math.abs(dirx) < 0.3 ? 'middle' : dirx > 0 ? 'start' : 'end';
    g.append(svg('text', { x: cx, y: cy, 'text-anchor': anchor, class: 'node-caption' }, caption));
  }
  return g;
}

/** A legend that shows each state by line style and words, not by colour alone. */
function legend(): HTMLElement {
  const ul = document.createElement('ul');
  ul.className = 'ring-legend';
  const items: Array<[LinkState | 'inferred', string]> = [
    ['open', 'open (solid)'],
    ['connecting', 'connecting (dashed)'],
    ['closed', 'closed (dotted, ✕)'],
    ['unknown', 'not observed by this tab'],
  ];
  for (const [state, text] of items) {
    const li = document.createElement('li');
    const s = svg(
      'svg',
      { viewBox: '0 0 28 8', width: 28, height: 8, 'aria-hidden': 'true', class: `ring-link link-${state}` },
      svg('line', { x1: 1, y1: 4, x2: 27, y2: 4, class: 'link-line' }),
    );
    li.append(s, document.createTextNode(text));
    ul.append(li);
  }
  return ul;
}
