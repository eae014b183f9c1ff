/**
 * The start page when the URL has no session: choose the job's configuration, get the link that
 * every tab of the session opens. Nothing is sent anywhere; the link is the session. The fields,
 * their rules and the link come from session_link.ts (and through it from the job's schema).
 */
import { FORM_FIELDS, checkForm, fieldDefaults, formConfig, sessionUrl, type FormField, type FormValues } from './session_link.ts';
import { el, shareField } from './dom.ts';
import { newSessionToken } from '../../src/session_token.ts';
import './dashboard.css';

function randomName(): string {
  const words = ['amber', 'brisk', 'cedar', 'delta', 'ember', 'fjord', 'gale', 'harbor', 'iris', 'juniper', 'kite', 'lumen', 'maple', 'nova', 'onyx', 'pine'];
  const w = words[Math.floor(Math.random() * words.length)]!;
  return `${w}-${Math.random().toString(36).slice(2, 6)}`;
}

type Control = HTMLInputElement | HTMLSelectElement;

function controlFor(field: FormField, id: string, describedBy: string): Control {
  const c = field.control;
  if (c.type === 'select') {
    return el('select', { id, name: field.name, 'aria-describedby': describedBy }, ...c.choices.map((o) => el('option', { value: o }, o)));
  }
  return el('input', {
    id,
    name: field.name,
    type: c.type,
    min: c.type === 'number' ? c.min : undefined,
    max: c.type === 'number' ? c.max : undefined,
    step: c.type === 'number' ? 1 : undefined,
    inputmode: c.type === 'text' ? c.inputmode : undefined,
    required: !field.optional,
    autocomplete: 'off',
    spellcheck: 'false',
    'aria-describedby': describedBy,
  });
}

export function mountCreateForm(root: HTMLElement, options: { origin: string }): void {
  const controls = new Map<string, { control: Control; error: HTMLElement }>();
  /** Fields the person typed their own value into; the others follow their default. */
  const edited = new Set<string>();
  const form = el('form', { class: 'create-form', novalidate: true, 'data-testid': 'create-form', 'aria-labelledby': 'create-title' });

  const values = (): FormValues => Object.fromEntries([...controls].map(([name, c]) => [name, c.control.value.trim()]));

  /** Refill the fields the person has not made their own (e.g. the learning rate after an optimizer change). */
  const followDefaults = () => {
    const defaults = fieldDefaults(values());
    for (const [name, c] of controls) {
      const value = defaults[name];
      if (value !== undefined && !edited.has(name) && c.control.value !== value) c.control.value = value;
    }
  };

  /** Show each field's message (all of them on submit, else only fields already flagged). */
  const showErrors = (all: boolean): HTMLElement | null => {
    const errors = checkForm(values());
    let firstBad: HTMLElement | null = null;
    for (const [name, c] of controls) {
      if (!all && c.control.getAttribute('aria-invalid') !== 'true') continue;
      const msg = errors[name] ?? '';
      c.error.textContent = msg;
      if (msg) c.control.setAttribute('aria-invalid', 'true');
      else c.control.removeAttribute('aria-invalid');
      if (msg && !firstBad) firstBad = c.control;
    }
    return firstBad;
  };

  for (const field of FORM_FIELDS) {
    const id = `cf-${field.name}`;
    const errId = `${id}-error`;
    const hintId = `${id}-hint`;
    const control = controlFor(field, id, [field.hint ? hintId : '', errId].filter(Boolean).join(' '));
    const error = el('p', { id: errId, class: 'field-error', 'data-testid': `error-${field.name}` });
    const node = el('div', { class: `field field-${field.name}` }, el('label', { for: id }, field.label), control);
    if (field.hint) node.append(el('p', { id: hintId, class: 'field-hint' }, field.hint));
    node.append(error);
    form.append(node);
    controls.set(field.name, { control, error });
    control.addEventListener(control instanceof HTMLSelectElement ? 'change' : 'input', () => {
      // A value chosen or typed is the person's own; clearing a field hands it back to its default.
      if (control.value.trim() === '') edited.delete(field.name);
      else edited.add(field.name);
      followDefaults();
      // Re-validate as the person fixes a flagged field, not while they first type.
      showErrors(false);
    });
  }
  controls.get('session')!.control.value = randomName();
  followDefaults();

  const submit = el('button', { type: 'submit', class: 'btn btn-primary' }, 'Create session');
  form.append(el('div', { class: 'form-actions' }, submit));

  const result = el('section', { class: 'card create-result', hidden: true, 'aria-labelledby': 'cr-title', 'data-testid': 'create-result' });

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const firstBad = showErrors(true);
    if (firstBad) {
      firstBad.focus();
      result.hidden = true;
      return;
    }
    showResult(values());
  });

  function showResult(v: FormValues): void {
    // A new secret per session: whoever has the link can join it, nobody else.
    const url = sessionUrl(options.origin, v, newSessionToken());
    const { min, max } = formConfig(v);
    const share = shareField('cr-link', 'Link to share', url);
    share.input.setAttribute('data-testid', 'share-link');
    const join = el('a', { href: url, class: 'btn btn-primary', 'data-testid': 'join-link' }, 'Join this session (open as a rank)');
    const starts = min === max ? 'training starts when all have joined.' : `training starts once ${min} have joined, and up to ${max} train together.`;
    result.replaceChildren(
      el('h2', { id: 'cr-title' }, `Session “${v.session}” is ready`),
      el('p', {}, `Open this link in ${max} tab${max === 1 ? '' : 's'} (on this computer or others that can reach this server). `, `Each tab becomes one rank; ${starts}`),
      share.root,
      el('p', { class: 'form-actions' }, join),
    );
    result.hidden = false;
    result.scrollIntoView({ block: 'nearest' });
    join.focus();
  }

  root.append(
    el(
      'div',
      { class: 'ddp-ui create-page' },
      el(
        'header',
        { class: 'create-header' },
        el('h1', { id: 'create-title' }, 'New training session'),
        el('p', { class: 'lede' }, 'Train one model together in several browser tabs: each tab is a rank, gradients are averaged over a WebRTC ring.'),
      ),
      el('section', { class: 'card' }, form),
      result,
    ),
  );
}
