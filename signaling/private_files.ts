/**
 * What the server writes under its data folder (checkpoints, token hashes) is its own: files are
 * created 0600 and folders 0700, so that other users of the machine cannot read a session's
 * weights or list its checkpoints. (The umask may take more bits away, never add any.)
 */
import { chmod, mkdir, stat } from 'node:fs/promises';
import { dirname, relative, resolve, sep } from 'node:path';

/** Files the server writes: readable and writable by its own user only. */
export const PRIVATE_FILE_MODE = 0o600;
/** Folders it makes: its own user only. */
export const PRIVATE_DIR_MODE = 0o700;

/**
 * Makes `folder` (and the folders above it, up to and including `base`) if missing, each 0700;
 * returns the topmost one it made, as `mkdir(..., { recursive: true })` does. Folders below
 * `base` that exist already and are open to others (made by an older version, 0755) are closed
 * to 0700, so that their earlier files are out of other users' reach too. `base` itself, when it
 * exists already, is left as its owner made it (it may be a folder they chose).
 */
export async function privateFolder(base: string, folder: string): Promise<string | undefined> {
  const made = await mkdir(folder, { recursive: true, mode: PRIVATE_DIR_MODE });
  const top = resolve(base);
  const inside = relative(top, resolve(folder));
  if (inside === '' || inside.startsWith('..') || inside.startsWith(sep)) return made;
  for (let f = resolve(folder); f !== top && f.startsWith(top + sep); f = dirname(f)) {
    if (made !== undefined && (f === made || f.startsWith(made + sep))) continue; // made just now: 0700 already
    const mode = (await stat(f)).mode & 0o777;
    if ((mode & 0o077) !== 0) await chmod(f, mode & PRIVATE_DIR_MODE);
  }
  return made;
}
