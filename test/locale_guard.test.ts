/** The guard that keeps uPlot loading in a browser whose language is not a valid tag (WebKitGTK under LANG=C says "C"). */
import { describe, expect, it } from 'vitest';
import { validLanguage } from '../client/ui/locale_guard.ts';

describe('validLanguage', () => {
  it('accepts BCP 47 tags and refuses what Intl.NumberFormat would throw on', () => {
    expect(validLanguage('en-US')).toBe(true);
    expect(validLanguage('de')).toBe(true);
    expect(validLanguage('C')).toBe(false);
    expect(() => new Intl.NumberFormat('C')).toThrow(RangeError);
    expect(validLanguage('')).toBe(false);
    expect(validLanguage(undefined)).toBe(false);
  });
});
