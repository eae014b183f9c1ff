/**
 * Session secrets on the server (Jupyter's token, per session). A session is created by the
 * server's host (the create form, the launcher, `npm start`'s demo link, a hello from the server's
 * own machine or with its admin secret), which fixes its token; nobody else can make a session
 * exist, so a link without its token, or a made-up name, claims nothing. The server keeps only the
 * token's SHA-256: in memory while the session lives and for `keepMs` (a day) after it was last
 * used, and, once the session has checkpoints, in its checkpoint folder, so that a restarted
 * server or a session dropped for idleness cannot be claimed by someone else with its checkpoints.
 *
 * The same connection may fix a host secret (`hello.host`): only the one that fixes the token, so
 * that nobody who merely has the member link can make themselves host later. Kept the same way
 * (its SHA-256, persisted beside the token's as `host.sha256`).
 *
 * When the host removes a tab the session's token changes (`rotate`): the new hash replaces the old
 * one in memory at once and, where the old one was persisted, on disk. The last few replaced hashes
 * are remembered, so that a hello with an old token is told its link changed rather than that it is wrong.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SESSION_TOKEN } from '../src/wire/protocol.ts';
import { PRIVATE_FILE_MODE, privateFolder } from './private_files.ts';

/** The file in a session's checkpoint folder that holds its token's SHA-256 (hex). */
export const TOKEN_FILE = 'token.sha256';
/** The file beside it that holds the session's host secret's SHA-256 (hex), if it has one. */
export const HOST_FILE = 'host.sha256';
/** How many replaced tokens per session are remembered (to tell their holders the link changed). */
const MAX_RETIRED = 16;

/** What `claimSession` decided. */
export type Claim =
  /** A missing, malformed or wrong token: nothing was read or kept. */
  | { ok: false; why: 'token' }
  /** A token the host's removal of a tab replaced (`rotate`): the link is no longer valid. */
  | { ok: false; why: 'rotated' }
  /** The session does not exist and this hello may not create it (or the server knows too many). */
  | { ok: false; why: 'unknown' | 'full' }
  /** The token is the session's; `created`: this call fixed it (and the host secret, if given). */
  | { ok: true; created: boolean };

/** Whether a hello's host secret makes its connection the host. */
export type HostCheck =
  /** It is the session's host secret. */
  | 'host'
  /** No host secret given, or the session has none (then one given is ignored). */
  | 'member'
  /** A host secret was given and it is not the session's. */
  | 'wrong';

export type TokenCheck =
  /** The token is the session's. */
  | 'ok'
  /** No token was given, or it is not a well-formed token. */
  | 'missing'
  /** A token was given and it is not the session's. */
  | 'wrong'
  /** The session has no token yet (it never had a connection and has no checkpoints). */
  | 'unknown';

/**
 * Token and host-secret hashes the servers on one engine share (`--store`; engine_store.ts), so
 * that a session created through one server opens on every other. Hashes only: a reader of the
 * engine cannot join a session with them.
 */
export interface SharedHashes {
  /** The session's shared hash `name` (TOKEN_FILE, HOST_FILE), if any; a session without a host secret has none for HOST_FILE. */
  read(session: string, name: string): Promise<Buffer | undefined>;
  /** Fixes the session's token and host hashes unless another server did first; resolves with the ones kept. */
  claim(session: string, token: Buffer, host: Buffer | null): Promise<{ token: Buffer; host: Buffer | null }>;
  /** The token changed (the host removed a tab). */
  replace(session: string, token: Buffer): Promise<void>;
}

export class SessionTokens {
  private readonly hashes = new Map<string, Buffer>();
  /** Host secret hashes; null: the session has none (known, so the disk is not read again). */
  private readonly hosts = new Map<string, Buffer | null>();
  /** Sessions without a live store, by when they were last used: forgotten `keepMs` after. */
  private readonly idle = new Map<string, number>();
  /** Hashes of the tokens `rotate` replaced, per session, oldest first (at most MAX_RETIRED). */
  private readonly retired = new Map<string, Buffer[]>();
  /** Each session's token-file writes, one after another (a rotation's must not be overtaken by an older hash). */
  private readonly tokenWrites = new Map<string, Promise<void>>();

  /**
   * @param dir the checkpoint folder (one sub-folder per session), where persisted hashes live.
   * @param maxSessions most sessions whose tokens are kept at once (a creation past it is refused).
   * @param keepMs how long a session's token outlives its last use.
   */
  constructor(
    private readonly dir: string,
    private readonly maxSessions = 4096,
    private readonly keepMs = 24 * 3600_000,
    /** Shared with the other servers of one engine: read before the disk, fixed on creation. */
    private readonly shared?: SharedHashes,
  ) {}

  /**
   * Creates `session` with `token` (and `host`) as its creator does (the server's own callers: the
   * launcher, `npm start`). Creating an existing session with its own token changes nothing.
   * Throws when the session exists with another token, or the server knows too many sessions.
   */
  async create(session: string, token: string, host?: string): Promise<void> {
    if (!SESSION_TOKEN.test(token) || (host !== undefined && !SESSION_TOKEN.test(host)))
      throw new Error('a session token and host secret are 22-128 characters of A-Z a-z 0-9 _ - (newSessionToken() makes one)');
    const claim = await this.claimSession(session, token, host, true);
    if (!claim.ok)
      throw new Error(
        claim.why === 'full'
          ? `the server keeps ${this.maxSessions} sessions already: no room for "${session}"`
          : `session "${session}" exists already with another token`,
      );
    if (claim.created) this.idle.set(session, Date.now());
  }

  /**
   * `hello`: accepts the session's token, or fixes it when the session has none yet (not ok for a
   * missing, malformed or wrong token), and says whether this call fixed the token. The call that fixes it also fixes the
   * host secret `host` (or that the session has none), in the same step, so no other hello can
   * come between the two. `host` must be well-formed (the caller checks, before claiming).
   */
  async claimSession(session: string, token: string | undefined, host: string | undefined, mayCreate: boolean): Promise<Claim> {
    if (token === undefined || !SESSION_TOKEN.test(token)) return { ok: false, why: 'token' };
    const hash = sha256(token);
    // Shared with other servers: theirs is the current one (another server's host may have ended or rotated it).
    const shared = await this.shared?.read(session, TOKEN_FILE);
    const known = shared ?? this.hashes.get(session) ?? (await this.readPersisted(session, TOKEN_FILE));
    // Another hello may have fixed it while this one read the disk: the first one wins.
    const current = shared ?? this.hashes.get(session) ?? known;
    if (current === undefined) {
      if (!mayCreate) return { ok: false, why: 'unknown' };
      if (this.hashes.size >= this.maxSessions) return { ok: false, why: 'full' };
      if (this.shared) return this.claimShared(session, hash, host === undefined ? null : sha256(host));
      this.hashes.set(session, hash);
      this.hosts.set(session, host === undefined ? null : sha256(host));
      return { ok: true, created: true };
    }
    if (!timingSafeEqual(current, hash)) return { ok: false, why: this.wasRotated(session, token) ? 'rotated' : 'token' };
    // Kept in memory only for a session someone entered: a wrong guess leaves nothing behind.
    this.hashes.set(session, current);
    this.idle.delete(session);
    return { ok: true, created: false };
  }

  /** Creation on a shared engine: the first server's claim wins; this one's hello is then checked against it. */
  private async claimShared(session: string, hash: Buffer, host: Buffer | null): Promise<Claim> {
    const kept = await this.shared!.claim(session, hash, host);
    this.hashes.set(session, kept.token);
    this.hosts.set(session, kept.host);
    if (!timingSafeEqual(kept.token, hash)) return { ok: false, why: 'token' };
    // Fixed by this hello only if the host hash is the one it gave too (else another server's hello did).
    const same = kept.host === null ? host === null : host !== null && timingSafeEqual(kept.host, host);
    return { ok: true, created: same };
  }

  /**
   * The host removed a tab: `session`'s token becomes `next`, in memory at once (a hello or an
   * HTTP request with the old one is refused from now on); `persistRotation` writes it where the
   * old one was persisted. Throws when the session has no token in memory (no live connection).
   */
  rotate(session: string, next: string): void {
    const old = this.hashes.get(session);
    if (old === undefined) throw new Error(`session "${session}" has no token in memory to replace`);
    if (!SESSION_TOKEN.test(next)) throw new Error('a session token is 22-128 characters of A-Z a-z 0-9 _ - (newSessionToken() makes one)');
    this.hashes.set(session, sha256(next));
    void this.shared?.replace(session, sha256(next)).catch(() => {});
    const retired = [...(this.retired.get(session) ?? []), old];
    this.retired.set(session, retired.slice(-MAX_RETIRED));
  }

  /** After `rotate`: the new token's hash replaces the old one's in the session's checkpoint folder, if it had one there. */
  async persistRotation(session: string): Promise<void> {
    if ((await this.readPersisted(session, TOKEN_FILE)) !== undefined) await this.writeToken(session);
  }

  /** Whether `token` is the session's token now, as kept in memory (no disk read, so nothing can change in between). */
  isCurrent(session: string, token: string): boolean {
    const current = this.hashes.get(session);
    return current !== undefined && timingSafeEqual(current, sha256(token));
  }

  /** Whether `token` was one of the session's tokens, replaced when the host removed a tab. */
  wasRotated(session: string, token: string | undefined): boolean {
    if (token === undefined || !SESSION_TOKEN.test(token)) return false;
    const hash = sha256(token);
    return (this.retired.get(session) ?? []).some((old) => timingSafeEqual(old, hash));
  }

  /** Checks a hello's host secret, after its token was accepted by `claimSession`. */
  async checkHost(session: string, host: string | undefined): Promise<HostCheck> {
    const known = await this.hostHash(session);
    if (host === undefined || known === null) return 'member';
    return SESSION_TOKEN.test(host) && timingSafeEqual(known, sha256(host)) ? 'host' : 'wrong';
  }

  /** Whether the session has a host secret (after a `claimSession` or `checkHost` loaded it). */
  hasHost(session: string): boolean {
    return (this.hosts.get(session) ?? null) !== null;
  }

  private async hostHash(session: string): Promise<Buffer | null> {
    const inMemory = this.hosts.get(session);
    if (inMemory !== undefined) return inMemory;
    // Not fixed by this server: the session's token came from its checkpoint folder.
    const persisted = (await this.readPersisted(session, HOST_FILE)) ?? null;
    const current = this.hosts.get(session);
    if (current !== undefined) return current;
    this.hosts.set(session, persisted);
    return persisted;
  }

  /** Checks a token without fixing one (checkpoint routes). */
  async verify(session: string, token: string | undefined): Promise<TokenCheck> {
    if (token === undefined || !SESSION_TOKEN.test(token)) return 'missing';
    const known = this.hashes.get(session) ?? (await this.readPersisted(session, TOKEN_FILE));
    if (known === undefined) return 'unknown';
    return timingSafeEqual(known, sha256(token)) ? 'ok' : 'wrong';
  }

  /**
   * Writes the session's token hash into its checkpoint folder (before its first checkpoint), and
   * its host secret's hash beside it, so that a restarted server keeps both.
   */
  async persist(session: string): Promise<void> {
    // A session dropped for idleness is known only by its persisted hash: nothing to write then.
    const hash = this.hashes.get(session) ?? (await this.readPersisted(session, TOKEN_FILE));
    if (hash === undefined) throw new Error(`session "${session}" has no token to persist`);
    const folder = join(this.dir, session);
    await privateFolder(this.dir, folder);
    // The host's first: a crash between the two leaves a host file without a token file, which a
    // new claim ignores (it fixes both); the other order could keep a token and lose its host.
    const host = this.hosts.get(session);
    if (host === null)
      await rm(join(folder, HOST_FILE), { force: true }); // a stray one from an older session of this name
    else if (host !== undefined) await this.writeHash(session, HOST_FILE, host);
    // The hash in memory when the write runs: a rotation meanwhile must not be undone on disk.
    if (this.hashes.has(session)) await this.writeToken(session);
    else await this.writeHash(session, TOKEN_FILE, hash);
  }

  /** Writes the session's current token hash (read when the write runs) to its token file, after any earlier write. */
  private writeToken(session: string): Promise<void> {
    const write = async () => {
      const hash = this.hashes.get(session);
      if (hash !== undefined) await this.writeHash(session, TOKEN_FILE, hash);
    };
    const next = (this.tokenWrites.get(session) ?? Promise.resolve()).then(write, write);
    this.tokenWrites.set(session, next);
    const done = () => {
      if (this.tokenWrites.get(session) === next) this.tokenWrites.delete(session);
    };
    next.then(done, done);
    return next;
  }

  /**
   * The session's store was dropped (idle): its token is kept `keepMs` more, so that its links
   * still work; then its name is free again unless a checkpoint folder holds its hash.
   */
  release(session: string, now = Date.now()): void {
    if (this.hashes.has(session)) this.idle.set(session, now);
  }

  /** Forgets the tokens of sessions unused for `keepMs` (the sessions sweeper calls it). */
  expire(now = Date.now()): void {
    for (const [session, since] of this.idle) {
      if (now - since <= this.keepMs) continue;
      this.idle.delete(session);
      this.forget(session);
    }
  }

  /** Forgets a session's token now (a store that could not be made after its hello created it). */
  forget(session: string): void {
    this.hashes.delete(session);
    this.hosts.delete(session);
    this.idle.delete(session);
    this.retired.delete(session);
  }

  private async writeHash(session: string, name: string, hash: Buffer): Promise<void> {
    const existing = await this.readPersisted(session, name);
    if (existing?.equals(hash)) return;
    const file = join(this.dir, session, name);
    // Unique: two first uploads of a session may persist at the same time.
    const tmp = `${file}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
    await writeFile(tmp, `${hash.toString('hex')}\n`, { mode: PRIVATE_FILE_MODE });
    await rename(tmp, file);
  }

  private async readPersisted(session: string, name: string): Promise<Buffer | undefined> {
    const shared = await this.shared?.read(session, name);
    if (shared !== undefined) return shared;
    let text: string;
    try {
      text = await readFile(join(this.dir, session, name), 'utf8');
    } catch {
      return undefined;
    }
    const hex = text.trim();
    // A damaged file must not open the session to anyone: an all-zero hash matches no token.
    return /^[0-9a-f]{64}$/.test(hex) ? Buffer.from(hex, 'hex') : Buffer.alloc(32);
  }
}

function sha256(token: string): Buffer {
  // Tokens and host secrets alike.
  return createHash('sha256').update(token, 'utf8').digest();
}
