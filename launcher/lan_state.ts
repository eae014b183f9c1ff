/**
 * The state of `--lan` runs on disk (launcher/lan.ts): the private state root holding each run's
 * folder (wrapper scripts, coturn's files) and its subnet reservations, reserving a /24, and
 * sweeping what runs of dead processes left behind.
 */
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CANDIDATES, chooseSubnet, ownerPid, runOfName } from './lan_names.ts';
import { checkLanSupport, netnsNames, rootLinks, rootPrefixes, runSync } from './lan_tools.ts';
import { killRunTurnserver } from './turn.ts';

/**
 * Where runs keep their subnet reservations and Chromium wrapper scripts (cleared on reboot under
 * /run): made private to this user, and refused when it is not (a folder another user made in a
 * shared $TMPDIR could plant wrapper scripts that run as root, or records that steer the sweep).
 */
export function stateRoot(): string {
  const root = existsSync('/run') ? '/run/browser-ddp-lan' : join(tmpdir(), 'browser-ddp-lan');
  mkdirSync(root, { recursive: true, mode: 0o700 });
  const info = lstatSync(root);
  const uid = process.getuid?.() ?? info.uid;
  if (!info.isDirectory() || info.uid !== uid || (info.mode & 0o022) !== 0) {
    throw new Error(
      `--lan keeps its state in ${root}, which is not a folder private to this user (owner uid ${info.uid}, mode ${(info.mode & 0o777).toString(8)}): remove it and run again`,
    );
  }
  return root;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Removes what runs of dead processes left: their namespaces, their root-namespace veths, their
 * subnet reservations and wrapper scripts. Returns what it removed.
 */
export function sweepLeftovers(tools = checkLanSupport()): string[] {
  const removed: string[] = [];
  const root = stateRoot();
  const dead = (name: string) => {
    const pid = ownerPid(name);
    return pid !== undefined && !pidAlive(pid);
  };
  // A namespace or link is swept only when a run of ours recorded it (its folder in our own state
  // root): a name that merely looks like ours belongs to someone else.
  const oursAndDead = (name: string) => {
    const tag = runOfName(name);
    return tag !== undefined && dead(tag) && existsSync(join(root, tag));
  };
  for (const link of rootLinks(tools.ip).filter(oursAndDead)) {
    try {
      runSync(tools.ip, ['link', 'del', link]);
      removed.push(`link ${link}`);
    } catch {
      /* gone meanwhile */
    }
  }
  for (const ns of netnsNames(tools.ip).filter(oursAndDead)) {
    try {
      runSync(tools.ip, ['netns', 'del', ns]);
      removed.push(`netns ${ns}`);
    } catch {
      /* gone meanwhile */
    }
  }
  if (existsSync(root)) {
    for (const entry of readdirSync(root)) {
      // subnet-10.200.5 files hold their owner's tag; run directories are named by the tag.
      let owner = entry;
      if (entry.startsWith('subnet-')) {
        try {
          owner = readFileSync(join(root, entry), 'utf8').trim();
        } catch {
          continue;
        }
      }
      if (dead(owner)) {
        if (killRunTurnserver(join(root, entry))) removed.push(`turnserver of ${entry}`);
        rmSync(join(root, entry), { recursive: true, force: true });
        removed.push(`${root}/${entry}`);
      }
    }
  }
  return removed;
}

/** Reserves a free /24: a file created with O_EXCL, so that two runs starting at once get different ones. */
export function reserveSubnet(ip: string, tag: string): string {
  const root = stateRoot();
  mkdirSync(root, { recursive: true });
  const reserved = new Set<string>();
  for (const e of readdirSync(root)) if (e.startsWith('subnet-')) reserved.add(e.slice('subnet-'.length));
  for (let attempt = 0; attempt < 64; attempt++) {
    const prefix = chooseSubnet(rootPrefixes(ip), reserved, (process.pid * 7 + attempt) % CANDIDATES);
    try {
      writeFileSync(join(root, `subnet-${prefix}`), `${tag}\n`, { flag: 'wx' });
      return prefix;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      reserved.add(prefix); // another run took it meanwhile
    }
  }
  throw new Error(`could not reserve a /24 for the virtual LAN in ${root}`);
}
