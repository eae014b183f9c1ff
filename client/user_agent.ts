/**
 * Which browser a tab runs in, for the fleet table: a name, its major version, the operating
 * system and whether it is a phone. Pure: `parseBrowser` takes the user-agent string and, where
 * the browser has it, `navigator.userAgentData` (Chromium's client hints, which name the real
 * brand and platform where the frozen user-agent string no longer does); `thisBrowser` reads both
 * from the page.
 */

/** One entry of `navigator.userAgentData.brands`. */
export interface UaBrand {
  brand: string;
  version: string;
}

/** What `navigator.userAgentData` carries without asking for high-entropy values. */
export interface UaDataLike {
  brands?: readonly UaBrand[];
  mobile?: boolean;
  platform?: string;
}

export interface BrowserInfo {
  /** "Chrome", "Chromium", "Firefox", "Safari", "Edge", ...; "unknown browser" when nothing matched. */
  name: string;
  /** The major version ("156"), or null when unknown. */
  version: string | null;
  /** "Android", "iOS", "Windows", "macOS", "Linux", "ChromeOS", or null when unknown. */
  os: string | null;
  /** A phone (or another small touch device that says "mobile"). */
  mobile: boolean;
}

/** Brands that say more than "Chromium", by the name a person knows them by. */
const SPECIFIC_BRANDS: ReadonlyArray<[RegExp, string]> = [
  [/^Google Chrome$/i, 'Chrome'],
  [/^Microsoft Edge$/i, 'Edge'],
  [/^Opera( GX)?$/i, 'Opera'],
  [/^Brave$/i, 'Brave'],
  [/^Vivaldi$/i, 'Vivaldi'],
  [/^Samsung Internet$/i, 'Samsung Internet'],
  [/^YaBrowser$/i, 'Yandex Browser'],
];

/**
 * User-agent tokens in the order they must be tried: most browsers also say "Chrome" or
 * "Safari", so the specific ones come first.
 */
const UA_TOKENS: ReadonlyArray<[RegExp, string]> = [
  [/\bEdg(?:e|A|iOS)?\/(\d+)/, 'Edge'],
  [/\b(?:OPR|OPT)\/(\d+)/, 'Opera'],
  [/\bSamsungBrowser\/(\d+)/, 'Samsung Internet'],
  [/\bYaBrowser\/(\d+)/, 'Yandex Browser'],
  [/\bVivaldi\/(\d+)/, 'Vivaldi'],
  [/\bFxiOS\/(\d+)/, 'Firefox'],
  [/\bFirefox\/(\d+)/, 'Firefox'],
  [/\bCriOS\/(\d+)/, 'Chrome'],
  [/\bHeadlessChrome\/(\d+)/, 'Chrome (headless)'],
  [/\bChromium\/(\d+)/, 'Chromium'],
  [/\bChrome\/(\d+)/, 'Chrome'],
  [/\bEpiphany\/(\d+)/, 'Epiphany'],
  // WebKitGTK (GNOME Web's engine, MiniBrowser) on Linux says "Safari" too; Safari runs on Apple systems only.
  [/\bX11\b.*\bVersion\/(\d+)[.\d]* Safari\//, 'WebKitGTK'],
  [/\bVersion\/(\d+)[.\d]*(?: Mobile\/\w+)? Safari\//, 'Safari'],
];

/** Chromium's GREASE brands ("Not:A-Brand", "Not A(Brand", ";Not A Brand") name no browser. */
function isGrease(brand: string): boolean {
  return /not.?a.?brand/i.test(brand);
}

function major(version: string | undefined): string | null {
  const m = /^\s*(\d{1,6})/.exec(version ?? '');
  return m ? m[1]! : null;
}

function osFromUa(ua: string): string | null {
  if (/\b(iPhone|iPad|iPod)\b/.test(ua)) return 'iOS';
  if (/\bAndroid\b/.test(ua)) return 'Android';
  if (/\bCrOS\b/.test(ua)) return 'ChromeOS';
  if (/\bWindows\b/.test(ua)) return 'Windows';
  if (/\bMac OS X\b|\bMacintosh\b/.test(ua)) return 'macOS';
  if (/\bLinux\b|\bX11\b/.test(ua)) return 'Linux';
  return null;
}

/** Client hints' platform names as a person reads them. */
function osFromPlatform(platform: string | undefined): string | null {
  const p = (platform ?? '').trim();
  if (p === '' || /^unknown$/i.test(p)) return null;
  if (/^chrome ?os$/i.test(p)) return 'ChromeOS';
  if (/^mac ?os$/i.test(p)) return 'macOS';
  return p;
}

export function parseBrowser(ua: string, data?: UaDataLike | null): BrowserInfo {
  const brands = (data?.brands ?? []).filter((b) => typeof b?.brand === 'string' && !isGrease(b.brand));
  let name: string | null = null;
  let version: string | null = null;
  // A specific brand from the client hints is the most reliable name there is.
  for (const b of brands) {
    const known = SPECIFIC_BRANDS.find(([re]) => re.test(b.brand));
    if (known) {
      name = known[1];
      version = major(b.version);
      break;
    }
  }
  if (name === null) {
    for (const [re, label] of UA_TOKENS) {
      const m = re.exec(ua);
      if (!m) continue;
      name = label;
      version = m[1] ?? null;
      break;
    }
    // Chromium with client hints but no brand of its own (Debian's Chromium, say): "Chromium",
    // not the "Chrome" its user-agent string claims for compatibility.
    const chromium = brands.find((b) => /^Chromium$/i.test(b.brand));
    if (chromium && (name === null || name === 'Chrome' || name === 'Chrome (headless)')) {
      name = 'Chromium';
      version = major(chromium.version) ?? version;
    }
  }
  const uaMobile = /\bMobi(le)?\b|\biPhone\b|\biPod\b/.test(ua);
  return {
    name: name ?? 'unknown browser',
    version,
    os: osFromPlatform(data?.platform) ?? osFromUa(ua),
    mobile: typeof data?.mobile === 'boolean' ? data.mobile || uaMobile : uaMobile,
  };
}

/** "Chrome 156", "Safari 17", "unknown browser". */
export function browserLabel(b: BrowserInfo): string {
  return b.version ? `${b.name} ${b.version}` : b.name;
}

/** "Android phone", "iOS phone", "Linux", or null when neither is known. */
export function platformLabel(b: BrowserInfo): string | null {
  if (b.os === null) return b.mobile ? 'phone' : null;
  return b.mobile ? `${b.os} phone` : b.os;
}

/** This page's browser. */
export function thisBrowser(): BrowserInfo {
  const nav = navigator as Navigator & { userAgentData?: UaDataLike };
  return parseBrowser(navigator.userAgent, nav.userAgentData ?? null);
}
