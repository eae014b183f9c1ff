/**
 * Session tokens on the client side: making one, and carrying it in a share link's fragment
 * (`#token=...`), which browsers never send to the server, so it stays out of request lines and logs.
 */
import { SESSION_TOKEN } from './protocol.ts';

/** A new session secret: 256 bits from `crypto.getRandomValues`, base64url (43 characters). */
export function newSessionToken(): string {
  const bytes = new Uint8Array(32);
  crypto.getRandomValues(bytes);
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

/** Whether `token` has the form of a session token (it may still be the wrong one). */
export function isSessionToken(token: string): boolean {
  return SESSION_TOKEN.test(token);
}

/** The link `url` with `token` in its fragment (replacing any fragment it had). */
export function withToken(url: string | URL, token: string): string {
  const u = new URL(url);
  u.hash = new URLSearchParams({ token }).toString();
  return u.toString();
}

/** The token in a link's fragment (`location.hash` or a whole URL), or undefined when it has none. */
export function tokenFromFragment(hashOrUrl: string): string | undefined {
  const hash = hashOrUrl.includes('#') ? hashOrUrl.slice(hashOrUrl.indexOf('#') + 1) : hashOrUrl;
  const token = new URLSearchParams(hash).get('token');
  return token === null || token === '' ? undefined : token;
}
