/**
 * The machine side of `--lan` (launcher/lan.ts): finding `ip` and `tc`, running them (execFile,
 * argument vectors, no shell) and reading the root namespace's namespaces, links and prefixes.
 */
import { execFile, execFileSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { join } from 'node:path';

function findTool(name: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(':').filter(Boolean), '/usr/sbin', '/sbin', '/usr/bin', '/bin'];
  for (const d of dirs) {
    const p = join(d, name);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      /* next */
    }
  }
  return undefined;
}

/** The `ip` and `tc` binaries, or an error saying why --lan cannot run here (not Linux, not root, no iproute2). */
export function checkLanSupport(): { ip: string; tc: string } {
  if (process.platform !== 'linux') throw new Error(`--lan needs Linux network namespaces; this is ${process.platform}`);
  if (process.getuid?.() !== 0) {
    throw new Error(
      '--lan needs root: it creates network namespaces, veth links and tc qdiscs. Run the launcher as root ' +
        '(sudo npm run launch -- --nproc N --lan MBIT ..., or in a container as root), or drop --lan.',
    );
  }
  const ip = findTool('ip');
  const tc = findTool('tc');
  if (!ip || !tc) throw new Error(`--lan needs the ${!ip ? 'ip' : 'tc'} command (iproute2): apt-get install -y iproute2`);
  return { ip, tc };
}

export function run(bin: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(bin, args, { timeout: 15_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${bin.split('/').pop()} ${args.join(' ')}: ${String(stderr).trim() || err.message}`));
      else resolve(String(stdout));
    });
  });
}

export function runSync(bin: string, args: string[]): string {
  return execFileSync(bin, args, { timeout: 15_000, stdio: ['ignore', 'pipe', 'pipe'] }).toString();
}

/** Network namespaces by name (`ip netns list` prints "name (id: N)" or "name"). */
export function netnsNames(ip: string): string[] {
  return runSync(ip, ['netns', 'list'])
    .split('\n')
    .map((l) => l.trim().split(/\s+/)[0]!)
    .filter(Boolean);
}

/** Interfaces of the root namespace (`ip -o link`: "5: name@if4: <...>"). */
export function rootLinks(ip: string): string[] {
  return runSync(ip, ['-o', 'link', 'show'])
    .split('\n')
    .map((l) => /^\d+:\s+([^:@\s]+)/.exec(l)?.[1])
    .filter((n): n is string => n !== undefined);
}

/** Reads the root namespace's addresses and routes (what a /24 must not overlap). */
export function rootPrefixes(ip: string): string[] {
  const out: string[] = [];
  for (const line of runSync(ip, ['-o', '-4', 'addr', 'show']).split('\n')) {
    const m = /\sinet\s+(\S+)/.exec(line);
    if (m) out.push(m[1]!);
  }
  for (const line of runSync(ip, ['-4', 'route', 'show', 'table', 'all']).split('\n')) {
    const first = line.trim().split(/\s+/);
    // "10.0.0.0/8 via ...", "local 10.1.2.3 dev ...", "broadcast ..."; "default" overlaps everything and is skipped.
    const dst = ['local', 'broadcast', 'unicast', 'multicast', 'anycast', 'blackhole', 'unreachable', 'prohibit', 'throw'].includes(
      first[0]!,
    )
      ? first[1]
      : first[0];
    if (dst && dst !== 'default' && /^\d/.test(dst)) out.push(dst);
  }
  return out;
}
