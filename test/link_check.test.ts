/**
 * What a tab that cannot join is told (client/ui/link_check.ts), from the real server's
 * refusals over real WebSockets: an unknown session, a wrong token, an ended session; and a token
 * of the wrong form is told apart from none.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type RunningServer } from '../signaling/server.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { refusedLinkProblem, tokenProblem } from '../client/ui/link_check.ts';

/** The error the server's refusal of this hello becomes on the client. */
async function refusal(url: string, session: string, token: string): Promise<unknown> {
  return StoreClient.connect(url, { session, token, timeoutMs: 10_000 }).then(
    (c) => {
      c.close();
      throw new Error(`session "${session}" was joined`);
    },
    (err: unknown) => err,
  );
}

describe('a link that cannot join: what is wrong, and to ask the host', () => {
  let server: RunningServer;
  beforeAll(async () => {
    // Loopback hellos do not create sessions here: a session nobody created stays unknown.
    server = await startServer({ port: 0, log: () => {}, loopbackCreates: false });
  });
  afterAll(() => server.close());

  it('no token, and a token of the wrong form, are told apart before anything is sent', () => {
    expect(tokenProblem('', 's')).toMatchObject({ field: 'token', value: null, title: 'This link has no #token', offerCreate: false });
    expect(tokenProblem('#host=x', 's')?.title).toBe('This link has no #token');
    expect(tokenProblem('#token=abc', 's')).toMatchObject({ value: 'abc', title: 'This link’s #token is not valid' });
    expect(tokenProblem('#token=abc', 's')?.message).toContain('(this one has 3)');
    expect(tokenProblem(`#token=${'a'.repeat(30)}<b>`, 's')?.message).toContain('(this one has other characters)');
    expect(tokenProblem(`#token=${newSessionToken()}`, 's')).toBeNull();
  });

  it('the server refused it: an unknown session, then (once it exists) a wrong token, then an ended session', async () => {
    const session = 'refusals';
    const unknown = refusedLinkProblem(await refusal(server.url, session, newSessionToken()), session);
    expect(unknown).toMatchObject({ title: 'No session “refusals” on this server', offerCreate: false });
    expect(unknown?.action).toMatch(/^Ask the host for the link again/);

    const token = newSessionToken();
    const host = await StoreClient.connect(server.url, { session, token, host: newSessionToken(), admin: server.adminSecret });
    const wrong = refusedLinkProblem(await refusal(server.url, session, newSessionToken()), session);
    expect(wrong?.title).toBe('This link’s #token does not open this session');

    await host.control('end');
    host.close();
    const ended = refusedLinkProblem(await refusal(server.url, session, token), session);
    expect(ended).toMatchObject({ title: 'This session has ended', action: 'Ask the host for the link of a new session.' });
  });

  it('other errors are not a link problem: the dashboard says those', () => {
    expect(refusedLinkProblem(new Error('the server is unreachable'), 's')).toBeNull();
  });
});
