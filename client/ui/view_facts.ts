/** The facts card: this tab's rank, browser, backend, devices, data shard and job, and the link (and QR code) for more tabs. */
import type { DashboardState } from './dashboard_state.ts';
import { facts } from './dashboard_facts.ts';
import { el, rankColour, shareField } from './dom.ts';
import { qrSvg } from './qr.ts';
import { changeDetector, setText } from './view_dom.ts';
import './styles/panel_facts.css';

/** This tab's rank, backend, data shard and job, and the link for more tabs. */
export class FactsView {
  readonly node: HTMLElement;
  private readonly dd: Record<'rank' | 'browser' | 'backend' | 'devices' | 'shard' | 'job' | 'faults', HTMLElement>;
  private readonly faultList: { root: HTMLDetailsElement; list: HTMLElement };
  private readonly devicesNode: HTMLElement;
  private readonly changed = changeDetector();

  private readonly share: { root: HTMLElement; input: HTMLInputElement };
  private readonly qr: HTMLDetailsElement;

  constructor(shareUrl: string) {
    const fact = (label: string, key: string) => {
      const dd = el('dd', { 'data-fact': key }, '–');
      return { node: el('div', { class: 'fact' }, el('dt', {}, label), dd), dd };
    };
    const rank = fact('This tab', 'rank');
    const browser = fact('Browser', 'browser');
    const backend = fact('Backend', 'backend');
    const devices = fact('Devices', 'devices');
    devices.node.hidden = true;
    this.devicesNode = devices.node;
    const shard = fact('Data shard', 'shard');
    const job = fact('Job', 'job');
    const faults = fact('Faults survived', 'faults');
    faults.dd.setAttribute('data-testid', 'faults');
    // The group's fault history, the server's: shown once there is one.
    const list = el('ol', { class: 'fault-history-list' });
    this.faultList = {
      root: el(
        'details',
        { class: 'fault-history', 'data-testid': 'fault-history', hidden: true },
        el('summary', {}, 'Fault history'),
        list,
      ),
      list,
    };
    this.dd = {
      rank: rank.dd,
      browser: browser.dd,
      backend: backend.dd,
      devices: devices.dd,
      shard: shard.dd,
      job: job.dd,
      faults: faults.dd,
    };
    this.share = shareField('dash-share', 'Link for more tabs', shareUrl);
    this.share.input.setAttribute('data-testid', 'dash-share-link');
    this.qr = el('details', { class: 'qr-details' }, el('summary', {}, 'Show the link as a QR code'));
    // Drawn when opened: most tabs never need it.
    this.qr.addEventListener('toggle', () => this.drawQr());
    this.node = el(
      'section',
      { class: 'card facts-card', 'aria-label': 'This tab and the job' },
      el('dl', { class: 'dash-facts' }, rank.node, browser.node, backend.node, devices.node, shard.node, job.node, faults.node),
      this.faultList.root,
      this.share.root,
      this.qr,
    );
  }

  /** The link shown for more tabs now. */
  get shareUrl(): string {
    return this.share.input.value;
  }

  /** A better link to share (e.g. from an address other machines can reach, or with the session's new token). */
  setShareUrl(url: string): void {
    this.share.input.value = url;
    this.drawQr();
  }

  private drawQr(): void {
    if (!this.qr.open) return;
    const figure = el(
      'figure',
      { class: 'qr' },
      qrSvg(this.share.input.value, 'QR code of the link for more tabs'),
      el('figcaption', {}, 'Point a camera at it to open the session.'),
    );
    this.qr.querySelector('figure')?.remove();
    this.qr.append(figure);
  }

  render(s: DashboardState): void {
    if (!this.changed([s.config, s.self, s.worldSize, s.backend, s.devices, s.shard, s.epochBase, s.fleet, s.faults, s.summary])) return;
    const f = facts(s);
    setText(this.dd.rank, f.rank.text);
    setText(this.dd.browser, f.browser);
    this.dd.rank.style.setProperty('--rank-colour', f.rank.rank === null ? 'transparent' : rankColour(f.rank.rank));
    this.dd.rank.classList.toggle('has-rank', f.rank.rank !== null);
    const b = f.backend;
    if (b.kind === 'running') {
      const parts: Array<Node | string> = [el('strong', {}, b.name), b.detail];
      if (b.probe) parts.push(el('span', { class: 'backend-probe', 'data-testid': 'backend-probe' }, b.probe));
      if (b.fallback) parts.push(el('span', { class: 'fallback' }, b.fallback));
      this.dd.backend.replaceChildren(...parts);
    } else {
      setText(this.dd.backend, b.kind === 'requested' ? `${b.name} (requested)` : '–');
    }
    this.devicesNode.hidden = f.devices === null;
    this.dd.devices.replaceChildren(
      ...(f.devices ?? []).flatMap((d) => [
        el('span', { class: 'device' }, d.text),
        ...(d.fallback ? [el('span', { class: 'fallback' }, d.fallback)] : []),
      ]),
    );
    setText(this.dd.shard, f.shard);
    setText(this.dd.job, f.job);
    setText(this.dd.faults, f.faults.text);
    this.faultList.root.hidden = f.faults.history.length === 0;
    this.faultList.list.replaceChildren(...f.faults.history.map((line) => el('li', {}, line)));
  }
}
