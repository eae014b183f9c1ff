/**
 * The create form's fields (create_form.ts): one control per FORM_FIELDS entry with its hint and
 * error, the values that follow their defaults until the person types their own, the checks and
 * the sentences that depend on several fields.
 */
import {
  FORM_FIELDS,
  checkForm,
  fieldApplies,
  fieldDefaults,
  formConfig,
  minNote,
  type FormField,
  type FormValues,
} from './session_link.ts';
import { el } from './dom.ts';
import { estimateSentence } from './estimate.ts';
import type { ServerInfo } from './server_info.ts';

type Control = HTMLInputElement | HTMLSelectElement;

function controlFor(field: FormField, id: string, describedBy: string): Control {
  const c = field.control;
  if (c.type === 'select') {
    return el(
      'select',
      { id, name: field.name, 'aria-describedby': describedBy },
      ...c.choices.map((o, i) => el('option', { value: o }, c.labels?.[i] ?? o)),
    );
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

export class FormFields {
  private readonly controls = new Map<string, { control: Control; error: HTMLElement; hint: HTMLElement | null; node: HTMLElement }>();
  /** Fields the person typed their own value into; the others follow their default. */
  private readonly edited = new Set<string>();

  /** `estimate`: where the run's estimated duration is said. */
  constructor(private readonly estimate: HTMLElement) {}

  /** Every field, each with its label, hint and error; checked and described as the person types. */
  nodes(): HTMLElement[] {
    return FORM_FIELDS.map((field) => this.add(field));
  }

  private add(field: FormField): HTMLElement {
    const id = `cf-${field.name}`;
    const errId = `${id}-error`;
    const hintId = `${id}-hint`;
    const control = controlFor(field, id, [field.hint ? hintId : '', errId].filter(Boolean).join(' '));
    const error = el('p', { id: errId, class: 'field-error', 'data-testid': `error-${field.name}` });
    const node = el('div', { class: `field field-${field.name}` }, el('label', { for: id }, field.label), control);
    const hint = field.hint ? el('p', { id: hintId, class: 'field-hint', 'data-testid': `hint-${field.name}` }, field.hint) : null;
    if (hint) node.append(hint);
    node.append(error);
    this.controls.set(field.name, { control, error, hint, node });
    control.addEventListener(control instanceof HTMLSelectElement ? 'change' : 'input', () => {
      // A value chosen or typed is the person's own; clearing a field hands it back to its default.
      if (control.value.trim() === '') this.edited.delete(field.name);
      else this.edited.add(field.name);
      this.followDefaults();
      // Re-validate as the person fixes a flagged field, not while they first type.
      this.showErrors(false);
      this.describe();
    });
    return node;
  }

  values(): FormValues {
    return Object.fromEntries([...this.controls].map(([name, c]) => [name, c.control.value.trim()]));
  }

  /** Sets a field as the page's own choice (it still follows its default until the person types). */
  set(name: string, value: string): void {
    this.controls.get(name)!.control.value = value;
  }

  /** Fills in a preset: its values count as the person's own. */
  fill(preset: Readonly<Record<string, string>>): void {
    for (const [name, value] of Object.entries(preset)) {
      const c = this.controls.get(name);
      if (!c) continue;
      c.control.value = value;
      this.edited.add(name);
    }
    this.followDefaults();
    this.showErrors(false);
    this.describe();
  }

  /** Refill the fields the person has not made their own (e.g. the learning rate after an optimizer change). */
  followDefaults(): void {
    const defaults = fieldDefaults(this.values());
    for (const [name, c] of this.controls) {
      const value = defaults[name];
      if (value !== undefined && !this.edited.has(name) && c.control.value !== value) c.control.value = value;
    }
  }

  /** Show each field's message (all of them on submit, else only fields already flagged); the first bad field. */
  showErrors(all: boolean): HTMLElement | null {
    const errors = checkForm(this.values());
    let firstBad: HTMLElement | null = null;
    for (const [name, c] of this.controls) {
      if (!all && c.control.getAttribute('aria-invalid') !== 'true') continue;
      const msg = errors[name] ?? '';
      c.error.textContent = msg;
      if (msg) c.control.setAttribute('aria-invalid', 'true');
      else c.control.removeAttribute('aria-invalid');
      if (msg && !firstBad) firstBad = c.control;
    }
    return firstBad;
  }

  /** The sentences that depend on several fields: the minimum's meaning and the duration; and the fields that apply. */
  describe(): void {
    const v = this.values();
    for (const [name, c] of this.controls) c.node.hidden = !fieldApplies(name, v);
    const minHint = this.controls.get('min')?.hint;
    if (minHint) minHint.textContent = minNote(v);
    this.estimate.textContent =
      Object.keys(checkForm(v)).length === 0
        ? estimateSentence(formConfig(v))
        : 'Estimated duration: shown once every field above is valid.';
  }

  /**
   * "user" (the host's own model or data) only where the server offers it; an older server that
   * does not say keeps the choice, and one already chosen stays (the tab then says what is missing).
   */
  dropUnoffered(server: ServerInfo | null): void {
    if (!server?.offers) return;
    for (const [name, offered] of [
      ['model', server.offers.model],
      ['dataset', server.offers.data],
    ] as const) {
      const select = this.controls.get(name)?.control;
      if (offered || !(select instanceof HTMLSelectElement) || select.value === 'user') continue;
      for (const option of [...select.options]) if (option.value === 'user') option.remove();
    }
  }
}
