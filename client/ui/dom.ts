/** Small DOM and formatting helpers shared by the dashboard and the create form (no framework). */

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

export function fmtNumber(n: number, digits = 3): string {
  if (!Number.isFinite(n)) return '–';
  if (n !== 0 && Math.abs(n) < 10 ** -digits) return n.toExponential(1);
  return n.toLocaleString('en-US', { maximumFractionDigits: digits });
}

export function fmtPercent(fraction: number, digits = 1): string {
  return Number.isFinite(fraction) ? `${(fraction * 100).toFixed(digits)}%` : '–';
}

export function fmtInt(n: number): string {
  return Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '–';
}

/** "45 s", "3 min 05 s", "1 h 02 min". */
export function fmtDuration(sec: number): string {
  if (!Number.isFinite(sec) || sec < 0) return '–';
  const s = Math.round(sec);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, '0')} min`;
}

export function fmtClock(date: Date): string {
  const p = (n: number) => String(n).padStart(2, '0');
  return `${p(date.getHours())}:${p(date.getMinutes())}:${p(date.getSeconds())}`;
}

/**
 * Copy `text`; when the Clipboard API is missing (plain-http origins other than localhost) or
 * refuses, select the text in `input` so the person can press Ctrl+C themselves.
 * Resolves to the message to show next to the button.
 */
export async function copyText(text: string, input: HTMLInputElement): Promise<{ ok: boolean; message: string }> {
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
export function shareField(id: string, label: string, url: string): { root: HTMLElement; input: HTMLInputElement; setUrl(url: string): void } {
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
  const root = el('div', { class: 'share' }, el('label', { for: id, class: 'share-label' }, label), el('div', { class: 'share-row' }, input, button), msg);
  return {
    root,
    input,
    setUrl(next: string) {
      input.value = next;
    },
  };
}
