/**
 * The session's secret as a page finds it: in its link's fragment (`#token=...`), which the
 * browser never sends to the server. A person who opens a session link without one is its creator
 * (a link typed by hand): the page makes a token and puts it in the address bar, so the link they
 * copy from there is the one others need.
 */
import { isSessionToken, newSessionToken, tokenFromFragment, withToken } from '../src/session_token.ts';

/** A link's token problem, said for a person. */
export class MissingTokenError extends Error {
  override name = 'MissingTokenError';
}

/**
 * The token of this page's session. `create`: when the link has none, make one and show it in the
 * address bar (a person's tab); otherwise (the launcher's pages) a missing token is an error.
 */
export function pageToken(create: boolean): string {
  const token = tokenFromFragment(location.hash);
  if (token !== undefined) {
    if (!isSessionToken(token)) throw new MissingTokenError(`the link's #token=... is not a session token (22-128 characters of A-Z a-z 0-9 _ -): copy the whole link again`);
    return token;
  }
  if (!create) throw new MissingTokenError('the link has no #token=...: open the session with the full link it was shared with');
  const made = newSessionToken();
  history.replaceState(history.state, '', withToken(location.href, made));
  return made;
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
