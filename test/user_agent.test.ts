/** The fleet table's browser column: user-agent strings and client hints as real browsers send them. */
import { describe, expect, it } from 'vitest';
import { browserLabel, parseBrowser, platformLabel, type UaDataLike } from '../client/user_agent.ts';

const label = (ua: string, data?: UaDataLike) => {
  const b = parseBrowser(ua, data);
  return `${browserLabel(b)} | ${platformLabel(b) ?? '-'}`;
};

describe('parseBrowser from the user-agent string', () => {
  it.each([
    [
      'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36',
      'Chrome 126 | Windows',
    ],
    [
      'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36 Edg/126.0.2592.87',
      'Edge 126 | Windows',
    ],
    [
      'Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15',
      'Safari 17 | macOS',
    ],
    ['Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/60.5 Safari/605.1.15', 'WebKitGTK 60 | Linux'],
    [
      'Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1',
      'Safari 17 | iOS phone',
    ],
    [
      'Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/126.0.6478.54 Mobile/15E148 Safari/604.1',
      'Chrome 126 | iOS phone',
    ],
    [
      'Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) FxiOS/127.0 Mobile/15E148 Safari/605.1.15',
      'Firefox 127 | iOS phone',
    ],
    ['Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0', 'Firefox 128 | Linux'],
    ['Mozilla/5.0 (Android 14; Mobile; rv:128.0) Gecko/128.0 Firefox/128.0', 'Firefox 128 | Android phone'],
    [
      'Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Mobile Safari/537.36',
      'Chrome 126 | Android phone',
    ],
    [
      'Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/25.0 Chrome/121.0.0.0 Mobile Safari/537.36',
      'Samsung Internet 25 | Android phone',
    ],
    [
      'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/125.0.0.0 Safari/537.36 OPR/111.0.0.0',
      'Opera 111 | Windows',
    ],
    [
      'Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36',
      'Chrome 126 | ChromeOS',
    ],
    [
      'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/156.0.0.0 Safari/537.36',
      'Chrome (headless) 156 | Linux',
    ],
    ['Mozilla/5.0 (Linux; Android 14) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36', 'Chrome 126 | Android'],
    ['curl/8.5.0', 'unknown browser | -'],
    ['', 'unknown browser | -'],
  ])('%s', (ua, expected) => {
    expect(label(ua)).toBe(expected);
  });
});

describe('parseBrowser with client hints (navigator.userAgentData)', () => {
  const chromeUa = 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/156.0.0.0 Safari/537.36';

  it('names the specific brand, not GREASE nor "Chromium"', () => {
    const data = {
      brands: [
        { brand: 'Not/A)Brand', version: '8' },
        { brand: 'Chromium', version: '126' },
        { brand: 'Google Chrome', version: '126' },
      ],
      mobile: false,
      platform: 'Windows',
    };
    expect(label(chromeUa, data)).toBe('Chrome 126 | Windows');
    expect(label(chromeUa, { ...data, brands: [{ brand: 'Microsoft Edge', version: '126' }, ...data.brands] })).toBe('Edge 126 | Windows');
  });

  it('says Chromium for a Chromium without a brand of its own (Debian), headless or not', () => {
    const data = {
      brands: [
        { brand: 'Not:A-Brand', version: '8' },
        { brand: 'Chromium', version: '156' },
      ],
      mobile: false,
      platform: 'Linux',
    };
    expect(label(chromeUa, data)).toBe('Chromium 156 | Linux');
    expect(label(chromeUa.replace('Chrome/', 'HeadlessChrome/'), data)).toBe('Chromium 156 | Linux');
  });

  it('takes the platform and mobile flag from the hints (the reduced user-agent string hides the model)', () => {
    const ua = 'Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/156.0.0.0 Mobile Safari/537.36';
    expect(label(ua, { brands: [{ brand: 'Chromium', version: '156' }], mobile: true, platform: 'Android' })).toBe(
      'Chromium 156 | Android phone',
    );
    expect(label(chromeUa, { brands: [], mobile: false, platform: 'macOS' })).toBe('Chrome 156 | macOS');
    expect(label(chromeUa, { brands: [], mobile: false, platform: 'Chrome OS' })).toBe('Chrome 156 | ChromeOS');
    // An empty platform says nothing: the user-agent string's does.
    expect(label(chromeUa, { brands: [], mobile: false, platform: '' })).toBe('Chrome 156 | Linux');
  });

  it('keeps to the major version and ignores malformed brands', () => {
    const b = parseBrowser(chromeUa, {
      brands: [
        { brand: 'Google Chrome', version: '126.0.6478.126' },
        { brand: 42 as unknown as string, version: '1' },
      ],
    });
    expect(b.version).toBe('126');
    expect(parseBrowser(chromeUa, { brands: [{ brand: 'Google Chrome', version: 'x' }] }).version).toBeNull();
    expect(browserLabel({ name: 'Chrome', version: null, os: null, mobile: false })).toBe('Chrome');
  });
});
