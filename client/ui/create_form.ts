/**
 * The start page when the URL has no session: choose the job's configuration, get the link that
 * every tab of the session opens. Nothing is sent anywhere; the link is the session.
 */
import { el, shareField } from './dom.ts';
import './dashboard.css';

interface FieldSpec {
  name: string;
  label: string;
  hint?: string;
  /** A text/number input, or a select with these options. */
  input: { type: 'text' | 'number'; value: string; min?: number; max?: number; step?: string; inputmode?: string } | { options: string[]; value: string };
  /** Error message for this value, or null when valid. */
  validate: (value: string) => string | null;
}

const NAME_RE = /^[A-Za-z0-9_.-]{1,64}$/;

function randomName(): string {
  const words = ['amber', 'brisk', 'cedar', 'delta', 'ember', 'fjord', 'gale', 'harbor', 'iris', 'juniper', 'kite', 'lumen', 'maple', 'nova', 'onyx', 'pine'];
  const w = words[Math.floor(Math.random() * words.length)]!;
  return `${w}-${Math.random().toString(36).slice(2, 6)}`;
}

function intInRange(label: string, min: number, max: number): (v: string) => string | null {
  return (v) => {
    if (v.trim() === '') return `${label} is required.`;
    const n = Number(v);
    if (!Number.isInteger(n)) return `${label} must be a whole number.`;
    if (n < min || n > max) return `${label} must be between ${min} and ${max}.`;
    return null;
  };
}

function oneOf(label: string, options: string[]): (v: string) => string | null {
  return (v) => (options.includes(v) ? null : `Choose a ${label.toLowerCase()}.`);
}

const FIELDS: FieldSpec[] = [
  {
    name: 'session',
    label: 'Session name',
    hint: 'Letters, digits, “-”, “_” and “.”; up to 64 characters. Everyone who opens the link joins this session.',
    input: { type: 'text', value: '' },
    validate: (v) => (v === '' ? 'Session name is required.' : NAME_RE.test(v) ? null : 'Use only letters, digits, “-”, “_” and “.” (at most 64 characters).'),
  },
  {
    name: 'world',
    label: 'World size (tabs)',
    hint: 'How many tabs train together; training starts when all have joined.',
    input: { type: 'number', value: '2', min: 1, max: 64, step: '1' },
    validate: intInRange('World size', 1, 64),
  },
  {
    name: 'min',
    label: 'Keep training with at least (tabs)',
    hint: 'Leave empty to need every tab. Fewer than the world size makes the session elastic: it starts once this many tabs are in (later tabs join at the next step), and when a tab closes or freezes the rest regroup and go on, down to this many.',
    input: { type: 'number', value: '', min: 1, max: 64, step: '1' },
    validate: (v) => (v === '' ? null : intInRange('Minimum', 1, 64)(v)),
  },
  { name: 'model', label: 'Model', input: { options: ['mlp', 'cnn'], value: 'mlp' }, validate: oneOf('Model', ['mlp', 'cnn']) },
  { name: 'dataset', label: 'Dataset', input: { options: ['mnist', 'synthetic'], value: 'mnist' }, validate: oneOf('Dataset', ['mnist', 'synthetic']) },
  {
    name: 'batchSize',
    label: 'Batch size per rank',
    hint: 'The global batch is this times the world size.',
    input: { type: 'number', value: '64', min: 1, max: 4096, step: '1' },
    validate: intInRange('Batch size', 1, 4096),
  },
  {
    name: 'lr',
    label: 'Learning rate',
    input: { type: 'text', value: '0.001', inputmode: 'decimal' },
    validate: (v) => {
      if (v.trim() === '') return 'Learning rate is required.';
      const n = Number(v);
      if (!Number.isFinite(n) || n <= 0) return 'Learning rate must be a positive number, e.g. 0.001 or 1e-3.';
      if (n > 10) return 'Learning rate must be at most 10.';
      return null;
    },
  },
  { name: 'optimizer', label: 'Optimizer', input: { options: ['adam', 'sgd'], value: 'adam' }, validate: oneOf('Optimizer', ['sgd', 'adam']) },
  { name: 'epochs', label: 'Epochs', input: { type: 'number', value: '1', min: 1, max: 1000, step: '1' }, validate: intInRange('Epochs', 1, 1000) },
  {
    name: 'backend',
    label: 'Backend',
    hint: 'If a tab has no WebGPU it falls back and says which backend it uses.',
    input: { options: ['webgpu', 'webgl', 'wasm', 'cpu'], value: 'webgpu' },
    validate: oneOf('Backend', ['webgpu', 'webgl', 'wasm', 'cpu']),
  },
];

/** Build the session link; parameter order is the documented one. */
export function sessionUrl(origin: string, values: Record<string, string>): string {
  const p = new URLSearchParams();
  p.set('session', values.session ?? '');
  p.set('world', values.world ?? '');
  p.set('job', 'train');
  for (const k of ['model', 'dataset', 'batchSize', 'lr', 'optimizer', 'epochs', 'backend']) p.set(k, values[k] ?? '');
  // An elastic session: it starts with `min` tabs (more join at the next step) and survives losses down to it.
  const min = Number(values.min);
  const world = Number(values.world);
  if (Number.isInteger(min) && min >= 1 && min < world) {
    p.set('min', String(min));
    p.set('max', String(world));
  }
  return `${origin.replace(/\/+$/, '')}/?${p.toString()}`;
}

export function mountCreateForm(root: HTMLElement, options: { origin: string }): void {
  const controls = new Map<string, { control: HTMLInputElement | HTMLSelectElement; error: HTMLElement; spec: FieldSpec }>();
  const form = el('form', { class: 'create-form', novalidate: true, 'data-testid': 'create-form', 'aria-labelledby': 'create-title' });

  for (const spec of FIELDS) {
    const id = `cf-${spec.name}`;
    const errId = `${id}-error`;
    const hintId = `${id}-hint`;
    const describedBy = [spec.hint ? hintId : '', errId].filter(Boolean).join(' ');
    let control: HTMLInputElement | HTMLSelectElement;
    if ('options' in spec.input) {
      const select = el('select', { id, name: spec.name, 'aria-describedby': describedBy });
      for (const o of spec.input.options) select.append(el('option', { value: o, selected: o === spec.input.value }, o));
      control = select;
    } else {
      const i = spec.input;
      control = el('input', {
        id,
        name: spec.name,
        type: i.type,
        value: spec.name === 'session' ? randomName() : i.value,
        min: i.min,
        max: i.max,
        step: i.step,
        inputmode: i.inputmode,
        required: true,
        autocomplete: 'off',
        spellcheck: 'false',
        'aria-describedby': describedBy,
      });
    }
    const error = el('p', { id: errId, class: 'field-error', 'data-testid': `error-${spec.name}` });
    const field = el('div', { class: `field field-${spec.name}` }, el('label', { for: id }, spec.label), control);
    if (spec.hint) field.append(el('p', { id: hintId, class: 'field-hint' }, spec.hint));
    field.append(error);
    form.append(field);
    controls.set(spec.name, { control, error, spec });
    // Re-validate as the person fixes a flagged field, not while they first type.
    control.addEventListener('input', () => {
      if (control.getAttribute('aria-invalid') === 'true') check(spec.name);
    });
  }

  const submit = el('button', { type: 'submit', class: 'btn btn-primary' }, 'Create session');
  form.append(el('div', { class: 'form-actions' }, submit));

  const result = el('section', { class: 'card create-result', hidden: true, 'aria-labelledby': 'cr-title', 'data-testid': 'create-result' });

  function check(name: string): string | null {
    const c = controls.get(name)!;
    const msg = c.spec.validate(c.control.value.trim());
    c.error.textContent = msg ?? '';
    if (msg) c.control.setAttribute('aria-invalid', 'true');
    else c.control.removeAttribute('aria-invalid');
    return msg;
  }

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    let firstBad: HTMLElement | null = null;
    for (const name of controls.keys()) if (check(name) && !firstBad) firstBad = controls.get(name)!.control;
    if (firstBad) {
      firstBad.focus();
      result.hidden = true;
      return;
    }
    const values: Record<string, string> = {};
    for (const [name, c] of controls) values[name] = c.control.value.trim();
    // Normalise numbers ("1e-3" stays as typed is fine, but " 64 " or "064" should not).
    for (const k of ['world', 'batchSize', 'epochs']) values[k] = String(Number(values[k]));
    if (values.min !== '') values.min = String(Math.min(Number(values.min), Number(values.world)));
    showResult(sessionUrl(options.origin, values), values);
  });

  function showResult(url: string, values: Record<string, string>): void {
    const world = Number(values.world);
    const share = shareField('cr-link', 'Link to share', url);
    share.input.setAttribute('data-testid', 'share-link');
    const join = el('a', { href: url, class: 'btn btn-primary', 'data-testid': 'join-link' }, 'Join this session (open as a rank)');
    result.replaceChildren(
      el('h2', { id: 'cr-title' }, `Session “${values.session}” is ready`),
      el(
        'p',
        {},
        `Open this link in ${world} tab${world === 1 ? '' : 's'} (on this computer or others that can reach this server). `,
        'Each tab becomes one rank; training starts when all have joined.',
      ),
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
