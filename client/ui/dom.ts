/** Small DOM helpers shared by the dashboard and the create form (no framework); figures are formatted in format.ts. */

type Attrs = Record<string, string | number | boolean | undefined>;

/** Create an element; `false`/`undefined` attributes are skipped, `true` sets an empty attribute. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Array<Node | string>
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children);
  return node;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

export function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Array<Node | string>
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  node.append(...children);
  return node;
}

function setAttrs(node: Element, attrs: Attrs): void {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    node.setAttribute(k, v === true ? '' : String(v));
  }
}

/** Colours for ranks: all at least 4.3:1 against the white card background, neighbours differ in hue and lightness. */
const RANK_COLOURS = ['#1f6fd1', '#b25f00', '#8a3ffc', '#16823b', '#c0307a', '#00808a', '#d0382b', '#7a6200', '#3341b8', '#5b6573'];

export function rankColour(rank: number): string {
  return RANK_COLOURS[((rank % RANK_COLOURS.length) + RANK_COLOURS.length) % RANK_COLOURS.length]!;
}

/**
 * Copy `text`; when the Clipboard API is missing (plain-http origins other than localhost) or
 * refuses, select the text in `input` so the person can press Ctrl+C themselves.
 * Resolves to the message to show next to the button.
 */
async function copyText(text: string, input: HTMLInputElement): Promise<{ ok: boolean; message: string }> {
  try {
    if (!navigator.clipboard?.writeText) throw new Error('Clipboard API unavailable');
    await navigator.clipboard.writeText(text);
    return { ok: true, message: 'Copied to the clipboard.' };
  } catch {
    input.focus();
    input.select();
    const mac = /Mac|iPhone|iPad/.test(navigator.platform);
    return { ok: false, message: `Could not copy automatically: the link is selected, press ${mac ? '⌘C' : 'Ctrl+C'}.` };
  }
}

/** A read-only link field with a Copy button and a polite message area, used by both views. */
export function shareField(id: string, label: string, url: string): { root: HTMLElement; input: HTMLInputElement } {
  const input = el('input', { id, type: 'text', readonly: true, value: url, class: 'share-input', spellcheck: 'false' });
  const button = el('button', { type: 'button', class: 'btn btn-secondary', 'data-testid': 'copy-button' }, 'Copy');
  const msg = el('span', { class: 'share-msg', role: 'status' });
  button.addEventListener('click', () => {
    void copyText(input.value, input).then(({ ok, message }) => {
      msg.textContent = message;
      msg.classList.toggle('warn', !ok);
      button.textContent = ok ? 'Copied' : 'Copy';
      if (ok) setTimeout(() => (button.textContent = 'Copy'), 2000);
    });
  });
  // Clicking into the field selects it all: the only thing anyone does with it is copy it.
  input.addEventListener('focus', () => input.select());
  const root = el(
    'div',
    { class: 'share' },
    el('label', { for: id, class: 'share-label' }, label),
    el('div', { class: 'share-row' }, input, button),
    msg,
  );
  return { root, input };
}
