/**
 * How figures read on the page ("93.1%", "3 min 05 s", "12.5 ms"). Plain functions with no DOM,
 * so the dashboard's state module and its tests can use them in Node.
 */

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

/** "37.9 ms", "120 ms". */
export function fmtMs(ms: number): string {
  return Number.isFinite(ms) ? `${ms >= 100 ? ms.toFixed(0) : ms.toFixed(1)} ms` : '–';
}

/** Wall-clock time of day in the viewer's time zone, "14:03:27". */
export function fmtClock(date: Date): string {
  const p = (n: number) => String(n).padStart(2, '0');
  return `${p(date.getHours())}:${p(date.getMinutes())}:${p(date.getSeconds())}`;
}

/** "512 B", "1 kB", "24.1 kB", "3.25 MB": three significant digits at most, decimal units (as link rates are given). */
export function fmtBytes(bytes: number): string {
  if (!Number.isFinite(bytes)) return '–';
  const units = ['B', 'kB', 'MB', 'GB'];
  let v = bytes;
  let u = 0;
  while (Math.abs(v) >= 1000 && u < units.length - 1) {
    v /= 1000;
    u++;
  }
  if (u === 0) return `${Math.round(v)} B`;
  return `${Number(v.toPrecision(3))} ${units[u]}`;
}
