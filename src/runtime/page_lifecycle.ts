/**
 * The page's lifecycle, where there is a page (in Node, nothing happens). `pagehide` is the one
 * event that fires whenever a page stops taking part: the tab closes, it navigates away, or it
 * enters the back/forward cache. `beforeunload` is not used: it may be cancelled (the page then
 * stays), it does not fire on entering the cache, and mobile browsers often skip it.
 */

interface PageEvents {
  addEventListener(type: 'pagehide' | 'pageshow', listener: (e: { persisted?: boolean }) => void): void;
  removeEventListener(type: 'pagehide' | 'pageshow', listener: (e: { persisted?: boolean }) => void): void;
}

function page(): PageEvents | undefined {
  const g = globalThis as { addEventListener?: unknown; document?: unknown };
  // A window (not a Worker, not Node): only it has pagehide.
  return typeof g.addEventListener === 'function' && typeof g.document === 'object' ? (globalThis as unknown as PageEvents) : undefined;
}

/** Calls `listener` when the page is hidden for good or put in the back/forward cache; returns the unsubscribe. */
export function onPageHide(listener: (intoCache: boolean) => void): () => void {
  const target = page();
  if (!target) return () => {};
  const l = (e: { persisted?: boolean }) => listener(e.persisted === true);
  target.addEventListener('pagehide', l);
  return () => target.removeEventListener('pagehide', l);
}

/** Calls `listener` when the page comes back from the back/forward cache (its connections are gone). */
export function onPageRestored(listener: () => void): () => void {
  const target = page();
  if (!target) return () => {};
  const l = (e: { persisted?: boolean }) => {
    if (e.persisted === true) listener();
  };
  target.addEventListener('pageshow', l);
  return () => target.removeEventListener('pageshow', l);
}
