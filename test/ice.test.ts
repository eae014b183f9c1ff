/**
 * ICE servers from the server: configuration checks, coturn's TURN REST credentials (minted per
 * session, time-limited, only for a connection holding the session's token), and the store
 * client's view of them.
 */
import { createHmac } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { IceConfigError, checkIceConfig, iceConfigFromEnv, iceServersFor } from '../signaling/ice.ts';
import { startServer, type RunningServer } from '../signaling/server.ts';
import { StoreClient, UnauthorizedError } from '../src/index.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { isIceServers } from '../src/wire/protocol.ts';
import { tokenFor } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';
import { ServerStartError } from '../signaling/network.ts';

const SECRET = 'a-shared-secret-of-coturn-0123456789';

describe('ICE configuration', () => {
  it('reads ICE_SERVERS and TURN_* from the environment', () => {
    const c = iceConfigFromEnv({
      ICE_SERVERS: '[{"urls":"stun:10.0.0.2:3478"}]',
      TURN_SECRET: SECRET,
      TURN_URLS: 'turn:10.0.0.2:3478?transport=udp, turns:relay.lan:5349',
      TURN_TTL: '600',
    });
    expect(c.iceServers).toEqual([{ urls: ['stun:10.0.0.2:3478'] }]);
    expect(c.turn).toEqual({ secret: SECRET, urls: ['turn:10.0.0.2:3478?transport=udp', 'turns:relay.lan:5349'], ttlSec: 600 });
    expect(iceConfigFromEnv({})).toEqual({ iceServers: [] });
  });

  it('says which setting is wrong', () => {
    expect(() => iceConfigFromEnv({ ICE_SERVERS: 'stun:x' })).toThrow(errorOf(IceConfigError, /ICE_SERVERS must be JSON/));
    expect(() => iceConfigFromEnv({ ICE_SERVERS: '{"urls":"stun:x"}' })).toThrow(
      errorOf(IceConfigError, /ICE_SERVERS must be a JSON list/),
    );
    expect(() => iceConfigFromEnv({ ICE_SERVERS: '[{"urls":"http://x"}]' })).toThrow(
      errorOf(IceConfigError, /iceServers\[0\]: "urls" must be a stun:/),
    );
    expect(() => iceConfigFromEnv({ TURN_SECRET: SECRET })).toThrow(errorOf(IceConfigError, /needs both TURN_SECRET .* and TURN_URLS/));
    expect(() => iceConfigFromEnv({ TURN_SECRET: 'short', TURN_URLS: 'turn:x:3478' })).toThrow(
      errorOf(IceConfigError, /at least 16 characters/),
    );
    expect(() => iceConfigFromEnv({ TURN_SECRET: SECRET, TURN_URLS: 'stun:x:3478' })).toThrow(
      errorOf(IceConfigError, /must be turn: or turns:/),
    );
    expect(() => iceConfigFromEnv({ TURN_SECRET: SECRET, TURN_URLS: 'turn:x:3478', TURN_TTL: '5' })).toThrow(
      errorOf(IceConfigError, /TURN_TTL/),
    );
    expect(() => checkIceConfig({ iceServers: Array.from({ length: 9 }, () => ({ urls: ['stun:x'] })) })).toThrow(IceConfigError);
  });

  it("mints coturn's use-auth-secret credentials: expiry:session, HMAC-SHA1 in base64", () => {
    const now = Date.UTC(2026, 10, 22, 12, 0, 0);
    const [relay] = iceServersFor({ turn: { secret: SECRET, urls: ['turn:10.0.0.2:3478'], ttlSec: 3600 } }, 'class-7', now);
    const expiry = now / 1000 + 3600;
    expect(relay!.username).toBe(`${expiry}:class-7`);
    expect(relay!.credential).toBe(createHmac('sha1', SECRET).update(`${expiry}:class-7`).digest('base64'));
    expect(isIceServers([relay])).toBe(true);
  });

  it('the client refuses malformed lists', () => {
    expect(isIceServers([{ urls: ['javascript:alert(1)'] }])).toBe(false);
    expect(isIceServers([{ urls: 'stun:x' }])).toBe(false);
    expect(isIceServers(Array.from({ length: 17 }, () => ({ urls: ['stun:x'] })))).toBe(false);
    expect(isIceServers([{ urls: ['turn:x'], credential: 'x'.repeat(600) }])).toBe(false);
  });
});

describe('the server hands ICE servers to members', () => {
  let server: RunningServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });

  it('with the token: fixed servers plus TURN credentials for this session; without: nothing', async () => {
    server = await startServer({
      port: 0,
      log: () => {},
      ice: { iceServers: [{ urls: ['stun:10.9.0.1:3478'] }], turn: { secret: SECRET, urls: ['turn:10.9.0.1:3478'], ttlSec: 600 } },
    });
    const before = Date.now();
    const client = await StoreClient.connect(server.url, { session: 'ice-a', token: tokenFor('ice-a'), timeoutMs: 5_000 });
    const after = Date.now();
    try {
      expect(client.iceServers[0]).toEqual({ urls: ['stun:10.9.0.1:3478'] });
      const relay = client.iceServers[1]!;
      const [expiry, session] = relay.username!.split(':');
      expect(session).toBe('ice-a');
      // Issued during the connect, for ttlSec: bounded by the clock on either side, not by how long the connect took.
      expect(Number(expiry)).toBeGreaterThanOrEqual(Math.floor(before / 1000) + 600);
      expect(Number(expiry)).toBeLessThanOrEqual(Math.floor(after / 1000) + 600);
      expect(relay.credential).toBe(createHmac('sha1', SECRET).update(relay.username!).digest('base64'));
    } finally {
      client.close();
    }
    // A wrong token learns nothing: the hello is refused before any reply carries credentials.
    await expect(StoreClient.connect(server.url, { session: 'ice-a', token: newSessionToken(), timeoutMs: 5_000 })).rejects.toBeInstanceOf(
      UnauthorizedError,
    );
  });

  it('a stranger who makes up a session gets no relay credentials: only the host creates sessions', async () => {
    // loopbackCreates false: every connection here is treated as another machine's, as a stranger's on a LAN.
    server = await startServer({
      port: 0,
      log: () => {},
      loopbackCreates: false,
      ice: { turn: { secret: SECRET, urls: ['turn:10.9.0.1:3478'], ttlSec: 600 } },
    });
    const made = 'made-up';
    const refused = StoreClient.connect(server.url, { session: made, token: tokenFor(made), timeoutMs: 5_000 });
    await expect(refused).rejects.toBeInstanceOf(UnauthorizedError);
    await expect(refused).rejects.toThrow(
      errorOf(UnauthorizedError, /session "made-up" does not exist on this server. Open the full link the host shared/, {
        code: 'UNAUTHORIZED',
      }),
    );
    // Nothing was claimed: the name is still free, and the server holds no store for it.
    expect(server.sessions.has(made)).toBe(false);
    // A wrong admin secret creates nothing either.
    await expect(
      StoreClient.connect(server.url, { session: made, token: tokenFor(made), admin: newSessionToken(), timeoutMs: 5_000 }),
    ).rejects.toThrow(errorOf(UnauthorizedError, /does not exist/, { code: 'UNAUTHORIZED' }));

    // The host creates it (the launcher's way, or a hello with the admin secret); its members get credentials.
    await server.createSession('class-1', tokenFor('class-1'));
    const member = await StoreClient.connect(server.url, { session: 'class-1', token: tokenFor('class-1'), timeoutMs: 5_000 });
    expect(member.iceServers[0]!.username).toMatch(/^\d+:class-1$/);
    member.close();
    const host = await StoreClient.connect(server.url, {
      session: 'class-2',
      token: tokenFor('class-2'),
      admin: server.adminSecret,
      timeoutMs: 5_000,
    });
    expect(host.iceServers).toHaveLength(1);
    host.close();
    // Creating an existing session with another token fails; with its own, changes nothing.
    await expect(server.createSession('class-1', newSessionToken())).rejects.toThrow(/exists already with another token/);
    await server.createSession('class-1', tokenFor('class-1'));
  });

  it('a member renews its TURN credentials while it is connected: links formed later get fresh ones', async () => {
    server = await startServer({ port: 0, log: () => {}, ice: { turn: { secret: SECRET, urls: ['turn:10.9.0.1:3478'], ttlSec: 600 } } });
    const client = await StoreClient.connect(server.url, {
      session: 'ice-renew',
      token: tokenFor('ice-renew'),
      timeoutMs: 5_000,
      iceRenewMs: 200,
    });
    try {
      const first = client.iceServers[0]!.username!;
      await expect.poll(() => client.iceServers[0]!.username, { timeout: 4_000, interval: 100 }).not.toBe(first);
      const renewed = client.iceServers[0]!;
      expect(Number(renewed.username!.split(':')[0])).toBeGreaterThan(Number(first.split(':')[0]));
      expect(renewed.credential).toBe(createHmac('sha1', SECRET).update(renewed.username!).digest('base64'));
    } finally {
      client.close();
    }
  });

  it('none configured: an empty list (host candidates only)', async () => {
    server = await startServer({ port: 0, log: () => {}, ice: {} });
    const client = await StoreClient.connect(server.url, { session: 'ice-b', token: tokenFor('ice-b'), timeoutMs: 5_000 });
    expect(client.iceServers).toEqual([]);
    client.close();
  });

  it('a bad configuration stops the server from starting, naming the setting', async () => {
    await expect(startServer({ port: 0, log: () => {}, ice: { turn: { secret: 'x', urls: ['turn:a'] } } })).rejects.toThrow(
      errorOf(ServerStartError, /TURN_SECRET/, { code: 'EICECONFIG' }),
    );
  });
});
