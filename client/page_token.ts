/**
 * The session's secret as a page finds it: in its link's fragment (`#token=...`), which the
 * browser never sends to the server. A link without one creates nothing and joins nothing: it is
 * most often a shared link that lost its end (chat apps cut it at the #); sessions are made on
 * the start page (the create form), which registers them with the server at once.
 */
import { isSessionToken, tokenFromFragment } from '../src/wire/session_token.ts';

/** A link's token problem, said for a person. */
export class MissingTokenError extends Error {
  override name = 'MissingTokenError';
}

/** The token of this page's session; MissingTokenError (saying what to do) when the link has none. */
export function pageToken(): string {
  const token = tokenFromFragment(location.hash);
  if (token !== undefined) {
    if (!isSessionToken(token))
      throw new MissingTokenError(
        `the link's #token=... is not a session token (22-128 characters of A-Z a-z 0-9 _ -): copy the whole link again`,
      );
    return token;
  }
  throw new MissingTokenError(
    "this link has no #token=... at its end, the session's secret (chat apps and some editors cut links at the #). Open the full link the host shared, or create a new session on the start page",
  );
}

/**
 * The server's admin secret, when this tab opened the admin link `npm start` prints for a host on
 * another machine (`#admin=...`): with it the create form may create sessions there.
 */
export function pageAdminSecret(): string | undefined {
  const hash = location.hash.startsWith('#') ? location.hash.slice(1) : location.hash;
  const admin = new URLSearchParams(hash).get('admin');
  return admin !== null && isSessionToken(admin) ? admin : undefined;
}

/**
 * The host's secret, when this tab opened the creator's own link (`#token=T&host=H`): it lets this
 * tab stop or end the session for everyone. The link shared with others carries only the token.
 */
export function pageHostSecret(): string | undefined {
  const hash = location.hash.startsWith('#') ? location.hash.slice(1) : location.hash;
  const host = new URLSearchParams(hash).get('host');
  return host !== null && isSessionToken(host) ? host : undefined;
}

/** `href` with the session's token `token` in its fragment, the rest of the fragment (the host's secret) kept. */
export function linkWithToken(href: string, token: string): string {
  const url = new URL(href);
  const fragment = new URLSearchParams(url.hash.replace(/^#/, ''));
  fragment.set('token', token);
  url.hash = fragment.toString();
  return url.toString();
}

/**
 * The host removed a tab and the session's token changed: this page's own URL takes the new one
 * (history.replaceState, no navigation), so that a reload opens the session again.
 */
export function adoptToken(token: string): void {
  history.replaceState(history.state, '', linkWithToken(location.href, token));
}
