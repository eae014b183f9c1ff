/**
 * Session secrets on the server (Jupyter's token, per session). The first connection to a session
 * name fixes its token; the server keeps only the token's SHA-256, in memory while the session
 * lives and, once the session has checkpoints, in its checkpoint folder, so that a restarted
 * server or a session dropped for idleness cannot be claimed by someone else with its checkpoints.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SESSION_TOKEN } from '../src/protocol.ts';

/** The file in a session's checkpoint folder that holds its token's SHA-256 (hex). */
export const TOKEN_FILE = 'token.sha256';

export type TokenCheck =
  /** The token is the session's. */
  | 'ok'
  /** No token was given, or it is not a well-formed token. */
  | 'missing'
  /** A token was given and it is not the session's. */
  | 'wrong'
  /** The session has no token yet (it never had a connection and has no checkpoints). */
  | 'unknown';

export class SessionTokens {
  private readonly hashes = new Map<string, Buffer>();

  /** @param dir the checkpoint folder (one sub-folder per session), where persisted hashes live. */
  constructor(private readonly dir: string) {}

  /**
   * `hello`: accepts the session's token, or fixes it when the session has none yet. Returns false
   * for a missing, malformed or wrong token.
   */
  async claim(session: string, token: string | undefined): Promise<boolean> {
    if (token === undefined || !SESSION_TOKEN.test(token)) return false;
    const hash = sha256(token);
    const known = this.hashes.get(session) ?? (await this.readPersisted(session));
    // Another hello may have fixed it while this one read the disk: the first one wins.
    const current = this.hashes.get(session) ?? known;
    if (current === undefined) {
      this.hashes.set(session, hash);
      return true;
    }
    if (!timingSafeEqual(current, hash)) return false;
    // Kept in memory only for a session someone entered: a wrong guess leaves nothing behind.
    this.hashes.set(session, current);
    return true;
  }

  /** Checks a token without fixing one (checkpoint routes). */
  async verify(session: string, token: string | undefined): Promise<TokenCheck> {
    if (token === undefined || !SESSION_TOKEN.test(token)) return 'missing';
    const known = this.hashes.get(session) ?? (await this.readPersisted(session));
    if (known === undefined) return 'unknown';
    return timingSafeEqual(known, sha256(token)) ? 'ok' : 'wrong';
  }

  /** Writes the session's token hash into its checkpoint folder (before its first checkpoint). */
  async persist(session: string): Promise<void> {
    // A session dropped for idleness is known only by its persisted hash: nothing to write then.
    const hash = this.hashes.get(session) ?? (await this.readPersisted(session));
    if (hash === undefined) throw new Error(`session "${session}" has no token to persist`);
    const folder = join(this.dir, session);
    await mkdir(folder, { recursive: true });
    const file = join(folder, TOKEN_FILE);
    const existing = await this.readPersisted(session);
    if (existing !== undefined && existing.equals(hash)) return;
    // Unique: two first uploads of a session may persist at the same time.
    const tmp = `${file}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
    await writeFile(tmp, hash.toString('hex') + '\n', { mode: 0o600 });
    await rename(tmp, file);
  }

  /** The session was dropped: its name is free again unless a checkpoint folder holds its hash. */
  forget(session: string): void {
    this.hashes.delete(session);
  }

  private async readPersisted(session: string): Promise<Buffer | undefined> {
    let text: string;
    try {
      text = await readFile(join(this.dir, session, TOKEN_FILE), 'utf8');
    } catch {
      return undefined;
    }
    const hex = text.trim();
    // A damaged file must not open the session to anyone: an all-zero hash matches no token.
    return /^[0-9a-f]{64}$/.test(hex) ? Buffer.from(hex, 'hex') : Buffer.alloc(32);
  }
}

function sha256(token: string): Buffer {
  return createHash('sha256').update(token, 'utf8').digest();
}
