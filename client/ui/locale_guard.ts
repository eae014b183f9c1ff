/**
 * uPlot formats numbers with `new Intl.NumberFormat(navigator.language)` when its module loads. A
 * browser whose language is not a valid BCP 47 tag (WebKitGTK started with LANG=C reports "C")
 * makes that throw a RangeError, which stopped the whole page module: a blank page. Imported
 * before uPlot (charts.ts), this makes such a browser report "en-US" instead.
 */
export function validLanguage(tag: string | undefined): boolean {
  if (!tag) return false;
  try {
    return Intl.getCanonicalLocales(tag).length === 1;
  } catch {
    return false;
  }
}

if (typeof navigator !== 'undefined' && !validLanguage(navigator.language)) {
  Object.defineProperty(navigator, 'language', { configurable: true, get: () => 'en-US' });
}
