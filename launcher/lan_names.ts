/**
 * The names and addresses of `--lan` runs (launcher/lan.ts): the run tag every namespace and
 * interface starts with, the owner a name tells, and the free /24 a run takes (pure; unit-tested
 * in test/lan.test.ts).
 */

/** The run's name prefix: `ddp<pid base 36>-<run number base 36>` (at most 3+6+1+3 = 13 characters). */
export function runTag(pid: number, seq: number): string {
  return `ddp${pid.toString(36)}-${(seq % 36 ** 3).toString(36)}`;
}

/** Every name of a run. Interface names must stay within 15 characters (IFNAMSIZ - 1). */
export function lanNames(tag: string): {
  lanNs: string;
  hostNs(i: number): string;
  serverVeth: string;
  bridge: string;
  hostPort(i: number): string;
  serverPort: string;
} {
  return {
    lanNs: `${tag}-lan`,
    hostNs: (i) => `${tag}-h${i}`,
    // In the root namespace: the only interface name that must be unique across runs.
    serverVeth: `${tag}s`,
    // Inside the run's own namespaces: no other run can see them.
    bridge: 'br0',
    hostPort: (i) => `h${i}`,
    serverPort: 'srv',
  };
}

/** The pid that owns a namespace, interface or state file of ours, or undefined for names that are not ours. */
export function ownerPid(name: string): number | undefined {
  const m = /^ddp([0-9a-z]{1,6})-[0-9a-z]/.exec(name);
  if (!m) return undefined;
  const pid = parseInt(m[1]!, 36);
  return Number.isSafeInteger(pid) && pid > 0 ? pid : undefined;
}

/** The run a namespace or root interface name belongs to (`<tag>-lan`, `<tag>-h<i>`, `<tag>s`), or undefined. */
export function runOfName(name: string): string | undefined {
  const tag = /^(ddp[0-9a-z]{1,6}-[0-9a-z]{1,3})(?:-lan|-h\d+|s)$/.exec(name)?.[1];
  return tag !== undefined && ownerPid(tag) !== undefined ? tag : undefined;
}

/** An IPv4 prefix as [first address, last address] (32-bit unsigned). */
export function cidrRange(cidr: string): [number, number] | undefined {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:\/(\d{1,2}))?$/.exec(cidr.trim());
  if (!m) return undefined;
  const octets = m.slice(1, 5).map(Number);
  if (octets.some((o) => o > 255)) return undefined;
  const bits = m[5] === undefined ? 32 : Number(m[5]);
  if (bits > 32) return undefined;
  const addr = ((octets[0]! << 24) | (octets[1]! << 16) | (octets[2]! << 8) | octets[3]!) >>> 0;
  const size = 2 ** (32 - bits);
  const first = Math.floor(addr / size) * size;
  return [first, first + size - 1];
}

/** Candidates: 10.200.0.0/24 ... 10.254.255.0/24. */
const CANDIDATE_FIRST = (10 << 24) | (200 << 16);
export const CANDIDATES = 55 * 256;

/**
 * A /24 (as "10.A.B") that overlaps none of `inUse` (CIDRs or addresses: the root namespace's
 * addresses and routes, the default route excluded) and is not in `reserved`, trying candidates
 * from `start` on (a per-process offset, so that runs starting together rarely try the same one).
 */
export function chooseSubnet(inUse: readonly string[], reserved: ReadonlySet<string>, start = 0): string {
  const ranges = inUse.map(cidrRange).filter((r): r is [number, number] => r !== undefined && !(r[0] === 0 && r[1] === 0xffffffff));
  for (let k = 0; k < CANDIDATES; k++) {
    const first = CANDIDATE_FIRST + (((start + k) % CANDIDATES) << 8);
    const last = first + 255;
    const prefix = `${first >>> 24}.${(first >>> 16) & 255}.${(first >>> 8) & 255}`;
    if (reserved.has(prefix)) continue;
    if (ranges.some(([a, b]) => a <= last && b >= first)) continue;
    return prefix;
  }
  throw new Error('no free /24 in 10.200.0.0-10.254.255.255 for the virtual LAN: every one overlaps an address or route of this machine');
}
