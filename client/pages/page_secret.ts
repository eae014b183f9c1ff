/**
 * The session's token as a page holds it, and the host's removal of a tab as the page sees it.
 * When the host removes a tab the session's token changes: the tabs that stay take the new one
 * (their URL, so that a reload works; their link for more tabs; their later requests), and the
 * removed tab, whose socket the server closed with REMOVED, stops and says so.
 */
import type { StoreClient } from '../../src/index.ts';
import { CloseCode } from '../../src/wire/protocol.ts';
import { adoptToken } from '../page_token.ts';

export interface SecretEvents {
  /** The session's link changed (`reason`: the server's words, "the host removed rank 2 of round 5 from the session"). */
  linkChanged(token: string, reason: string): void;
  /** The host removed this tab (once). */
  removed(): void;
}

export class PageSecret {
  private removedByHost = false;

  constructor(
    private current: string,
    private readonly on: SecretEvents,
  ) {}

  /** The session's token now: the link's, until the host removes a tab and the server sends a new one. */
  get token(): string {
    return this.current;
  }

  /** The host removed this tab. */
  get removed(): boolean {
    return this.removedByHost;
  }

  /** The server sent the session's new token (on any connection of this page): taken once. */
  changed(next: string, reason = 'the host removed a tab from the session'): void {
    if (next === this.current) return;
    this.current = next;
    adoptToken(next);
    this.on.linkChanged(next, reason);
    console.log(`the session's link changed: ${reason}`);
  }

  /** The host removed this tab: said once. */
  markRemoved(): void {
    if (this.removedByHost) return;
    this.removedByHost = true;
    this.on.removed();
  }

  /** Follows a connection: a new token, or this tab's removal (its socket closed with REMOVED). */
  watch(store: StoreClient): void {
    store.on('token', (e) => this.changed(e.token, e.reason));
    store.on('close', (e) => {
      if (e.code === CloseCode.REMOVED) this.markRemoved();
    });
  }
}
