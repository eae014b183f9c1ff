/**
 * The start page when the URL has no session: choose the job's configuration, get the link that
 * every tab of the session opens. The session is created on the server at once (`register`), with
 * its token: from then on its link works and a link without the token claims nothing. The fields,
 * their rules and the link come from session_link.ts (and through it from the job's schema).
 *
 * The link to share uses an address the class's computers can reach (the server's `/api/info`,
 * falling back to this page's own address), with a QR code of it; the creator's own "Join" link
 * also carries the host's secret, which lets that tab stop or end the session for everyone.
 */
import { DEMO_PRESET, formConfig, reachNote, sessionUrl, withOrigin, type FormValues } from './session_link.ts';
import { FormFields } from './create_form_fields.ts';
import { el, shareField } from './dom.ts';
import { fmtInt } from './format.ts';
import { qrSvg } from './qr.ts';
import { fetchServerInfo, type ServerInfo } from './server_info.ts';
import { newSessionToken } from '../../src/wire/session_token.ts';
import './styles/base.css';
import './styles/base_media.css';
import './styles/create_form.css';

function randomName(): string {
  const words = [
    'amber',
    'brisk',
    'cedar',
    'delta',
    'ember',
    'fjord',
    'gale',
    'harbor',
    'iris',
    'juniper',
    'kite',
    'lumen',
    'maple',
    'nova',
    'onyx',
    'pine',
  ];
  const w = words[Math.floor(Math.random() * words.length)]!;
  return `${w}-${Math.random().toString(36).slice(2, 6)}`;
}

export interface CreateFormOptions {
  /** This page's origin: the creator's own tab joins from here. */
  origin: string;
  /** Where other machines reach the server; defaults to asking the server (`/api/info`). */
  serverInfo?: () => Promise<ServerInfo | null>;
  /** Creates the session on the server with its token and host secret; rejects with a message to show. */
  register: (session: string, token: string, host: string) => Promise<void>;
}

export function mountCreateForm(root: HTMLElement, options: CreateFormOptions): void {
  // Asked once, at once: by the time the form is filled in, the answer is there.
  const info = (options.serverInfo ?? fetchServerInfo)();
  const form = el('form', { class: 'create-form', novalidate: true, 'data-testid': 'create-form', 'aria-labelledby': 'create-title' });
  const estimate = el('p', { class: 'estimate', id: 'cf-estimate', 'data-testid': 'estimate' });
  const fields = new FormFields(estimate);

  const demo = el(
    'button',
    { type: 'button', class: 'btn btn-secondary', 'data-testid': 'demo-preset', 'aria-describedby': 'cf-demo-hint' },
    'Quick demo',
  );
  form.append(
    el(
      'div',
      { class: 'presets' },
      demo,
      el(
        'p',
        { id: 'cf-demo-hint', class: 'field-hint' },
        `Fills in a short run on synthetic data for ${DEMO_PRESET.world} tabs (${DEMO_PRESET.steps} steps over ${fmtInt(Number(DEMO_PRESET.trainSize))} samples): open its link in ${DEMO_PRESET.world} tabs; training starts once ${DEMO_PRESET.min} have joined, and every tab trains.`,
      ),
    ),
  );
  form.append(...fields.nodes());
  fields.set('session', randomName());
  fields.followDefaults();
  void info.then((server) => fields.dropUnoffered(server));
  demo.addEventListener('click', () => fields.fill(DEMO_PRESET));

  const submit = el('button', { type: 'submit', class: 'btn btn-primary' }, 'Create session');
  form.append(estimate, el('div', { class: 'form-actions' }, submit));
  fields.describe();

  const result = el('section', {
    class: 'card create-result',
    hidden: true,
    'aria-labelledby': 'cr-title',
    'data-testid': 'create-result',
  });

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const firstBad = fields.showErrors(true);
    if (firstBad) {
      firstBad.focus();
      result.hidden = true;
      return;
    }
    void showResult(result, options, info, fields.values());
  });

  root.append(
    el(
      'div',
      { class: 'ddp-ui create-page' },
      el(
        'header',
        { class: 'create-header' },
        el('h1', { id: 'create-title' }, 'New training session'),
        el(
          'p',
          { class: 'lede' },
          'Train one model together in several browser tabs: each tab is a rank, gradients are averaged over a WebRTC ring.',
        ),
      ),
      el('section', { class: 'card' }, form),
      result,
    ),
  );
}

/** Creates the session on the server and shows its links (with a QR code), or why it was not created. */
async function showResult(result: HTMLElement, options: CreateFormOptions, info: Promise<ServerInfo | null>, v: FormValues): Promise<void> {
  // New secrets per session: whoever has the link can join it, nobody else; the host's secret
  // stays in the creator's own link.
  const token = newSessionToken();
  const host = newSessionToken();
  try {
    await options.register(v.session, token, host);
  } catch (err) {
    result.replaceChildren(
      el('h2', { id: 'cr-title' }, `Session “${v.session}” was not created`),
      el('p', { role: 'alert', 'data-testid': 'create-error' }, (err as Error).message),
    );
    result.hidden = false;
    return;
  }
  const own = sessionUrl(options.origin, v, token, host);
  const local = sessionUrl(options.origin, v, token);
  const server = await info;
  const addresses = server?.urls ?? [];
  const share = shareField('cr-link', 'Link to share', addresses.length ? withOrigin(local, addresses[0]!) : local);
  share.input.setAttribute('data-testid', 'share-link');
  const qr = el('figure', { class: 'qr' });
  const note = el('p', { class: 'share-note', 'data-testid': 'share-note' });
  const showLink = (url: string) => {
    share.input.value = url;
    qr.replaceChildren(
      qrSvg(url, 'QR code of the link to share'),
      el('figcaption', {}, 'The same link as a QR code: point a camera at it to open the session.'),
    );
    note.textContent = reachNote(url, server);
    note.hidden = note.textContent === '';
  };
  let chooser: HTMLElement | null = null;
  if (addresses.length > 1) {
    // Several networks (Wi-Fi, a cable, a VPN): the creator knows which one the class is on.
    const select = el('select', { id: 'cr-origin', 'data-testid': 'share-origin' }, ...addresses.map((u) => el('option', { value: u }, u)));
    select.addEventListener('change', () => showLink(withOrigin(local, select.value)));
    chooser = el('div', { class: 'field origin-choice' }, el('label', { for: 'cr-origin' }, 'Address the other computers use'), select);
  }
  const { min, max } = formConfig(v);
  const join = el(
    'a',
    { href: own, class: 'btn btn-primary', 'data-testid': 'join-link', 'aria-describedby': 'cr-join-note' },
    'Join this session (open as a rank)',
  );
  const starts =
    min === max
      ? 'training starts when all have joined.'
      : `training starts once ${min} ${min === 1 ? 'has' : 'have'} joined, and up to ${max} train together.`;
  result.replaceChildren(
    el('h2', { id: 'cr-title' }, `Session “${v.session}” is ready`),
    el(
      'p',
      {},
      `Open the link below in ${min === max ? '' : 'up to '}${max} tab${max === 1 ? '' : 's'}, on this computer or others. `,
      `Each tab becomes one rank; ${starts}`,
    ),
    ...(chooser ? [chooser] : []),
    el('div', { class: 'share-with-qr' }, el('div', { class: 'share-col' }, share.root, note), qr),
    el(
      'p',
      { class: 'form-actions' },
      join,
      el(
        'span',
        { id: 'cr-join-note', class: 'field-hint' },
        'Your own tab: it can stop the training or end the session for everyone. Share the link above, not this one.',
      ),
    ),
  );
  showLink(share.input.value);
  result.hidden = false;
  result.scrollIntoView({ block: 'nearest' });
  join.focus();
}
