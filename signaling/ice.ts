/**
 * The ICE servers the server hands to the members of a session (in the `hello` reply), so that
 * tabs that cannot reach each other directly (different NATs, separate networks) connect through
 * a relay. None by default: host candidates only, nothing leaves the network.
 *
 * TURN credentials are never configured into pages: they are minted per session and time-limited
 * from a secret shared with the TURN server, coturn's `use-auth-secret` (TURN REST API) scheme:
 * username = "<unix expiry>:<session>", credential = base64(HMAC-SHA1(secret, username)). Only a
 * connection that presented the session's token gets them.
 */
import { createHmac } from 'node:crypto';
import type { IceServer } from '../src/wire/protocol.ts';

export interface TurnConfig {
  /** coturn's `static-auth-secret`. */
  secret: string;
  /** turn: / turns: URLs of the relay, e.g. "turn:203.0.113.7:3478?transport=udp". */
  urls: string[];
  /** How long minted credentials stay valid, in seconds. Default 12 h. */
  ttlSec?: number;
}

export interface IceConfig {
  /** Handed as they are (STUN servers, or TURN servers with fixed credentials). */
  iceServers?: IceServer[];
  turn?: TurnConfig;
}

export class IceConfigError extends Error {
  override name = 'IceConfigError';
}

const ICE_URL = /^(stun|stuns|turn|turns):[^\s]{1,500}$/;
const DEFAULT_TTL_SEC = 12 * 3600;

/** Checks a configuration and says what is wrong with it, naming the setting. */
export function checkIceConfig(config: IceConfig, where = 'ice'): IceConfig {
  const urls = (list: unknown, name: string): string[] => {
    const all = typeof list === 'string' ? [list] : list;
    if (!Array.isArray(all) || all.length === 0 || !all.every((u) => typeof u === 'string' && ICE_URL.test(u))) {
      throw new IceConfigError(
        `${name}: "urls" must be a stun:, stuns:, turn: or turns: URL or a non-empty list of them, got ${JSON.stringify(list)}`,
      );
    }
    return all as string[];
  };
  const servers = (config.iceServers ?? []).map((s, i) => {
    const name = `${where}.iceServers[${i}]`;
    if (typeof s !== 'object' || s === null) throw new IceConfigError(`${name} must be an object like {"urls": "stun:host:3478"}`);
    const out: IceServer = { urls: urls(s.urls, name) };
    for (const k of ['username', 'credential'] as const) {
      if (s[k] === undefined) continue;
      if (typeof s[k] !== 'string' || s[k]!.length > 512)
        throw new IceConfigError(`${name}.${k} must be a string of at most 512 characters`);
      out[k] = s[k];
    }
    return out;
  });
  if (servers.length > 8) throw new IceConfigError(`${where}.iceServers: at most 8 servers, got ${servers.length}`);
  let turn: TurnConfig | undefined;
  if (config.turn) {
    const t = config.turn;
    if (typeof t.secret !== 'string' || t.secret.length < 16)
      throw new IceConfigError(`${where}.turn.secret (TURN_SECRET) must be at least 16 characters: coturn's static-auth-secret`);
    const turnUrls = urls(t.urls, `${where}.turn`);
    if (!turnUrls.every((u) => u.startsWith('turn')))
      throw new IceConfigError(`${where}.turn.urls (TURN_URLS) must be turn: or turns: URLs, got ${turnUrls.join(', ')}`);
    const ttlSec = t.ttlSec ?? DEFAULT_TTL_SEC;
    if (!(Number.isInteger(ttlSec) && ttlSec >= 60 && ttlSec <= 7 * 86400))
      throw new IceConfigError(`${where}.turn.ttlSec (TURN_TTL) must be whole seconds from 60 to 604800, got ${t.ttlSec}`);
    turn = { secret: t.secret, urls: turnUrls, ttlSec };
  }
  return { iceServers: servers, ...(turn ? { turn } : {}) };
}

/** ICE_SERVERS (a JSON list of RTCIceServer), TURN_SECRET, TURN_URLS (comma-separated), TURN_TTL (seconds). */
export function iceConfigFromEnv(env: NodeJS.ProcessEnv = process.env): IceConfig {
  let iceServers: IceServer[] = [];
  if (env.ICE_SERVERS) {
    try {
      iceServers = JSON.parse(env.ICE_SERVERS) as IceServer[];
    } catch (err) {
      throw new IceConfigError(`ICE_SERVERS must be JSON, e.g. [{"urls":"stun:192.168.1.2:3478"}]: ${(err as Error).message}`);
    }
    if (!Array.isArray(iceServers)) throw new IceConfigError('ICE_SERVERS must be a JSON list, e.g. [{"urls":"stun:192.168.1.2:3478"}]');
  }
  const hasTurn = env.TURN_SECRET !== undefined || env.TURN_URLS !== undefined;
  if (hasTurn && !(env.TURN_SECRET && env.TURN_URLS))
    throw new IceConfigError(
      "a TURN relay needs both TURN_SECRET (coturn's static-auth-secret) and TURN_URLS (e.g. turn:192.168.1.2:3478)",
    );
  const turn = hasTurn
    ? {
        secret: env.TURN_SECRET!,
        urls: env
          .TURN_URLS!.split(',')
          .map((u) => u.trim())
          .filter(Boolean),
        ...(env.TURN_TTL ? { ttlSec: Number(env.TURN_TTL) } : {}),
      }
    : undefined;
  return checkIceConfig({ iceServers, ...(turn ? { turn } : {}) }, 'env');
}

/** What a member of `session` gets: the fixed servers, and TURN credentials minted for it now. */
export function iceServersFor(config: IceConfig, session: string, nowMs = Date.now()): IceServer[] {
  const out = [...(config.iceServers ?? [])];
  const t = config.turn;
  if (t) {
    const expiry = Math.floor(nowMs / 1000) + (t.ttlSec ?? DEFAULT_TTL_SEC);
    const username = `${expiry}:${session}`;
    const credential = createHmac('sha1', t.secret).update(username).digest('base64');
    out.push({ urls: t.urls, username, credential });
  }
  return out;
}
