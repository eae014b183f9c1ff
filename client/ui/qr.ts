/**
 * A QR code of a link as SVG, so a class can open the session by pointing a phone or a laptop's
 * camera at the projected page. The `qrcode` package computes the modules; drawing them here as
 * one path keeps it crisp at any size and needs no canvas.
 */
import { create } from 'qrcode';
import { svg } from './dom.ts';

/** The path of the dark modules, each a unit square, offset by the quiet zone. */
export function qrPath(text: string, quiet = 4): { size: number; d: string } {
  // Level L: the fewest modules for a long link, so each is larger on screen; a screen is not
  // a smudged sticker and needs little error correction.
  const { modules } = create(text, { errorCorrectionLevel: 'L' });
  const n = modules.size;
  let d = '';
  for (let row = 0; row < n; row++) {
    for (let col = 0; col < n; col++) if (modules.get(row, col)) d += `M${col + quiet} ${row + quiet}h1v1h-1z`;
  }
  return { size: n + 2 * quiet, d };
}

export function qrSvg(text: string, label: string): SVGSVGElement {
  const { size, d } = qrPath(text);
  return svg(
    'svg',
    {
      class: 'qr-code',
      viewBox: `0 0 ${size} ${size}`,
      role: 'img',
      'aria-label': label,
      'shape-rendering': 'crispEdges',
      'data-testid': 'qr-code',
    },
    svg('rect', { width: size, height: size, fill: '#fff' }),
    svg('path', { d, fill: '#000' }),
  );
}
