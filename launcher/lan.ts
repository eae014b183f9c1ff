/**
 * `--lan MBIT`: a LAN in a box. Every rank is a host of its own: a network namespace with one veth
 * into a bridge, an address on a private /24 and its link shaped to MBIT Mbit/s in each direction
 * (a `tbf` qdisc on both ends of its veth: each end shapes its own egress). The launcher's Node
 * process stays in the root namespace and joins the bridge through a veth of its own with the .1
 * address, where the server listens. That link is NOT shaped: the server is the rendezvous and
 * signaling relay and serves the page; tensors go rank to rank, and each rank's own shaped link
 * already limits what the rank downloads or uploads.
 *
 *   root ns: launcher + server on 10.A.B.1 ── veth ──┐
 *   ns "ddp<run>-lan": bridge br0 ────────────────── ┼── h0 ══ eth0 (ns "ddp<run>-h0", 10.A.B.10, tbf both ends)
 *                                                    └── h1 ══ eth0 (ns "ddp<run>-h1", 10.A.B.11, tbf both ends)
 *
 * Each host namespace has a default route via 10.A.B.254, an address no host has: Chromium gathers
 * no ICE candidates without a default route, and with this one nothing can leave the LAN.
 *
 * `isolate`: the hosts' bridge ports are isolated (as a guest Wi-Fi isolates its clients): a rank
 * reaches the server's address and nothing else, the ranks cannot reach each other, and WebRTC
 * connects them only through a relay. `turn`: the launcher starts one, coturn (launcher/turn.ts),
 * listening on the server's address and relaying from an address on a /24 of its own (on the
 * launcher's veth) that no host has a route to, so a relayed link is relayed at both ends.
 *
 * Names carry the owning process's pid and a per-process run number (`ddp<pid36>-<n>`), so two runs
 * never collide and a later run sweeps what a dead run left behind. The /24 is one that no address
 * or route of the root namespace overlaps, reserved by a file created with O_EXCL in the state
 * directory, so two runs starting at once cannot take the same one. Everything goes through `ip`
 * and `tc` with execFile (argument vectors, no shell). Teardown runs when the run ends, on failure,
 * on the process's 'exit' and on SIGINT/SIGTERM/SIGHUP.
 */
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { accessSync, chmodSync, constants, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { findTurnserver, freeUdpPort, killRunTurnserver, newTurnSecret, RELAY_PORTS, TURN_REALM, TurnProcess } from './turn.ts';
import type { IceConfig } from '../signaling/ice.ts';

/** How fast each host's link is. */
export interface LanOptions {
  /** Every host's rate (Mbit/s, each direction); with `rates`, the rate of hosts beyond the list (ranks opened by --join). */
  rateMbit?: number;
  /** One rate per initial rank (host index 0..nproc-1): a heterogeneous LAN. */
  rates?: number[];
  /** Hosts cannot reach each other, only the server (isolated bridge ports). */
  isolate?: boolean;
  /** Start a TURN relay (Debian's coturn) for the run; the server hands the ranks credentials for it. */
  turn?: boolean;
}

/** One host on the LAN: a namespace, its address and its link's rate. */
export interface LanHost {
  index: number;
  namespace: string;
  address: string;
  rateMbit: number;
}

export interface LanSummary {
  rateMbit: number;
  rates?: number[];
  subnet: string;
  server: string;
  /** The run's name prefix: every namespace and interface of the run starts with it. */
  run: string;
  ranks: Array<{ rank: number | null; address: string; rateMbit: number; finished: boolean }>;
  /** The hosts could reach only the server (`isolate`). */
  isolated?: true;
  /** The run's TURN relay: where ranks reached it and the address it relayed from. */
  turn?: { url: string; relay: string };
}

// ---------------------------------------------------------------------------------------------
// Pure parts (unit-tested).

export const MIN_RATE_MBIT = 0.1;
export const MAX_RATE_MBIT = 10_000;

/** One rate in Mbit/s, as --lan or an item of --lan-rates gives it. */
export function parseRate(flag: string, value: string | undefined): number {
  const n = value === undefined || value.trim() === '' ? NaN : Number(value);
  if (!Number.isFinite(n) || n < MIN_RATE_MBIT || n > MAX_RATE_MBIT) {
    throw new Error(`${flag} takes a link rate in Mbit/s (each direction), ${MIN_RATE_MBIT}-${MAX_RATE_MBIT}, e.g. ${flag} 40; got "${value ?? ''}"`);
  }
  return n;
}

/** `--lan-rates 100,100,20`: one rate per rank, as many as --nproc. */
export function parseRates(value: string | undefined, nproc: number): number[] {
  const items = (value ?? '').split(',');
  const rates = items.map((s, i) => parseRate(`--lan-rates (item ${i + 1})`, s.trim()));
  if (rates.length !== nproc) {
    throw new Error(`--lan-rates gives ${rates.length} rate(s) (${value}) but --nproc is ${nproc}: give one rate per rank`);
  }
  return rates;
}

/** The rate of host `index`: its own from `rates`, else `rateMbit`, else the slowest of `rates`. */
export function rateOf(o: LanOptions, index: number): number {
  const own = o.rates?.[index];
  if (own !== undefined) return own;
  if (o.rateMbit !== undefined) return o.rateMbit;
  if (o.rates && o.rates.length > 0) return Math.min(...o.rates);
  throw new Error('a LAN needs a rate: --lan MBIT or --lan-rates R0,R1,...');
}

/** `tc qdisc add ... tbf` arguments for a rate: the verified recipe (burst 64 KiB, latency 200 ms), burst growing with the rate above ~100 Mbit/s. */
export function tbfArgs(rateMbit: number): string[] {
  const kbit = Math.max(1, Math.round(rateMbit * 1000));
  const burstBytes = Math.max(64 * 1024, Math.ceil((kbit * 1000) / 8 / 200)); // at least 5 ms of traffic
  return ['tbf', 'rate', `${kbit}kbit`, 'burst', String(burstBytes), 'latency', '200ms'];
}

/** The run's name prefix: `ddp<pid base 36>-<run number base 36>` (at most 3+6+1+3 = 13 characters). */
export function runTag(pid: number, seq: number): string {
  return `ddp${pid.toString(36)}-${(seq % 36 ** 3).toString(36)}`;
}

/** Every name of a run. Interface names must stay within 15 characters (IFNAMSIZ - 1). */
export function lanNames(tag: string): { lanNs: string; hostNs(i: number): string; serverVeth: string; bridge: string; hostPort(i: number): string; serverPort: string } {
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
const CANDIDATES = 55 * 256;

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

// ---------------------------------------------------------------------------------------------
// The machine.

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

/**
 * Where runs keep their subnet reservations and Chromium wrapper scripts (cleared on reboot under
 * /run): made private to this user, and refused when it is not (a folder another user made in a
 * shared $TMPDIR could plant wrapper scripts that run as root, or records that steer the sweep).
 */
function stateRoot(): string {
  const root = existsSync('/run') ? '/run/browser-ddp-lan' : join(tmpdir(), 'browser-ddp-lan');
  mkdirSync(root, { recursive: true, mode: 0o700 });
  const info = lstatSync(root);
  const uid = process.getuid?.() ?? info.uid;
  if (!info.isDirectory() || info.uid !== uid || (info.mode & 0o022) !== 0) {
    throw new Error(`--lan keeps its state in ${root}, which is not a folder private to this user (owner uid ${info.uid}, mode ${(info.mode & 0o777).toString(8)}): remove it and run again`);
  }
  return root;
}

/** The run a namespace or root interface name belongs to (`<tag>-lan`, `<tag>-h<i>`, `<tag>s`), or undefined. */
export function runOfName(name: string): string | undefined {
  const tag = /^(ddp[0-9a-z]{1,6}-[0-9a-z]{1,3})(?:-lan|-h\d+|s)$/.exec(name)?.[1];
  return tag !== undefined && ownerPid(tag) !== undefined ? tag : undefined;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function run(bin: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(bin, args, { timeout: 15_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${bin.split('/').pop()} ${args.join(' ')}: ${String(stderr).trim() || err.message}`));
      else resolve(String(stdout));
    });
  });
}

function runSync(bin: string, args: string[]): string {
  return execFileSync(bin, args, { timeout: 15_000, stdio: ['ignore', 'pipe', 'pipe'] }).toString();
}

/** Network namespaces by name (`ip netns list` prints "name (id: N)" or "name"). */
function netnsNames(ip: string): string[] {
  return runSync(ip, ['netns', 'list'])
    .split('\n')
    .map((l) => l.trim().split(/\s+/)[0]!)
    .filter(Boolean);
}

/** Interfaces of the root namespace (`ip -o link`: "5: name@if4: <...>"). */
function rootLinks(ip: string): string[] {
  return runSync(ip, ['-o', 'link', 'show'])
    .split('\n')
    .map((l) => /^\d+:\s+([^:@\s]+)/.exec(l)?.[1])
    .filter((n): n is string => n !== undefined);
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

/**
 * The safety net: a detached process (its own session, so Ctrl-C does not reach it) that reads a
 * pipe only this process holds. When this process is gone, however it ended (SIGKILL, a parent
 * such as tsx or npm killing it mid-teardown, a crash), the pipe closes and it removes the run's
 * namespaces, veth and files. After a normal teardown it finds nothing left to remove.
 */
const REAPER = `
const [ip, tag, stateRoot] = process.argv.slice(1);
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const run = (args) => { try { return execFileSync(ip, args, { stdio: ['ignore', 'pipe', 'ignore'], timeout: 15000 }).toString(); } catch { return ''; } };
let done = false;
const reap = () => {
  if (done) return;
  done = true;
  // The run's coturn first (its pid file, checked against its command line: pids are recycled).
  try {
    const dir = path.join(stateRoot, tag);
    const pid = Number(fs.readFileSync(path.join(dir, 'turnserver.pid'), 'utf8').trim());
    const cmd = fs.readFileSync('/proc/' + pid + '/cmdline', 'utf8');
    if (pid > 1 && cmd.includes('turnserver') && cmd.includes(dir)) process.kill(pid, 'SIGKILL');
  } catch {}
  run(['link', 'del', tag + 's']);
  const names = run(['netns', 'list']).split('\\n').map((l) => l.trim().split(/\\s+/)[0]).filter((n) => n && n.startsWith(tag + '-'));
  for (const n of names.sort((a, b) => (a.endsWith('-lan') ? 1 : 0) - (b.endsWith('-lan') ? 1 : 0))) run(['netns', 'del', n]);
  try {
    fs.rmSync(path.join(stateRoot, tag), { recursive: true, force: true });
    for (const e of fs.readdirSync(stateRoot)) {
      if (e.startsWith('subnet-') && fs.readFileSync(path.join(stateRoot, e), 'utf8').trim() === tag) fs.rmSync(path.join(stateRoot, e), { force: true });
    }
  } catch {}
  process.exit(0);
};
process.stdin.on('end', reap);
process.stdin.on('close', reap);
process.stdin.on('error', reap);
process.stdin.resume();
`;

function startReaper(ip: string, tag: string): ChildProcess {
  const child = spawn(process.execPath, ['-e', REAPER, ip, tag, stateRoot()], {
    detached: true,
    stdio: ['pipe', 'ignore', 'ignore'],
    env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' },
  });
  child.on('error', () => {});
  child.unref();
  (child.stdin as unknown as { unref(): void }).unref();
  child.stdin!.on('error', () => {});
  return child;
}

/** Live LANs of this process, torn down on 'exit' (synchronously) and on signals. */
const live = new Set<Lan>();
const SIGNALS = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 } as const;
const onExit = () => {
  for (const lan of [...live]) lan.closeSync();
};
// Node runs no 'exit' handlers on a signal: take it, tear down, and exit as the signal would have.
// The teardown is asynchronous so that the event loop keeps running meanwhile (tsx's child reports
// the signal to its parent over IPC, or is killed); whatever it has not finished when something
// else calls process.exit, the 'exit' handler and the reaper do.
let exiting = false;
const onSignal = (signal: NodeJS.Signals) => {
  const code = SIGNALS[signal as keyof typeof SIGNALS] ?? 1;
  if (exiting) return;
  exiting = true;
  setTimeout(() => process.exit(code), 5_000).unref();
  void Promise.all([...live].map((lan) => lan.close())).finally(() => process.exit(code));
};
function track(lan: Lan): void {
  if (live.size === 0) {
    process.on('exit', onExit);
    for (const s of Object.keys(SIGNALS)) process.on(s, onSignal);
  }
  live.add(lan);
}
function untrack(lan: Lan): void {
  if (!live.delete(lan) || live.size > 0) return;
  process.removeListener('exit', onExit);
  for (const s of Object.keys(SIGNALS)) process.removeListener(s, onSignal);
}

let runs = 0;

export class Lan {
  readonly names: ReturnType<typeof lanNames>;
  /** "10.A.B.0/24" */
  readonly subnet: string;
  /** The launcher's own address on the LAN, where the server listens. */
  readonly serverAddress: string;
  readonly hosts: LanHost[] = [];
  private readonly stateDir: string;
  private readonly reservations: string[];
  private chain: Promise<unknown> = Promise.resolve();
  private closed = false;
  private finished = false;
  private reaper?: ChildProcess;
  /** The run's TURN relay (`turn`), and the address it relays from. */
  private turn?: TurnProcess;
  private relayAddress?: string;

  /** Use createLan(). */
  constructor(
    readonly tag: string,
    private readonly prefix: string,
    readonly options: LanOptions,
    private readonly tools: { ip: string; tc: string },
    private readonly log: (line: string) => void,
  ) {
    this.names = lanNames(tag);
    this.subnet = `${prefix}.0/24`;
    this.serverAddress = `${prefix}.1`;
    this.stateDir = join(stateRoot(), tag);
    this.reservations = [join(stateRoot(), `subnet-${prefix}`)];
  }

  /** The address no host has, the hosts' default route (see the module comment). */
  get gateway(): string {
    return `${this.prefix}.254`;
  }

  private ip(...args: string[]): Promise<string> {
    return run(this.tools.ip, args);
  }
  private tc(...args: string[]): Promise<string> {
    return run(this.tools.tc, args);
  }

  /** The bridge and the launcher's veth into it (called once, by createLan). */
  async up(): Promise<void> {
    const n = this.names;
    track(this);
    this.reaper = startReaper(this.tools.ip, this.tag);
    mkdirSync(this.stateDir, { recursive: true });
    await this.ip('netns', 'add', n.lanNs);
    await this.ip('-n', n.lanNs, 'link', 'add', n.bridge, 'type', 'bridge');
    await this.ip('-n', n.lanNs, 'link', 'set', n.bridge, 'up');
    await this.ip('link', 'add', n.serverVeth, 'type', 'veth', 'peer', 'name', n.serverPort, 'netns', n.lanNs);
    await this.ip('-n', n.lanNs, 'link', 'set', n.serverPort, 'master', n.bridge, 'up');
    // IPv4 only: no link-local IPv6 addresses (and no duplicate-address detection delaying them).
    await this.ip('link', 'set', n.serverVeth, 'addrgenmode', 'none');
    await this.ip('addr', 'add', `${this.serverAddress}/24`, 'dev', n.serverVeth);
    await this.ip('link', 'set', n.serverVeth, 'up');
  }

  /** A new host (rank) namespace on the bridge, with its address, default route and shaped link. Serialized. */
  addHost(): Promise<LanHost> {
    const next = this.chain.then(() => this.createHost());
    this.chain = next.catch(() => {});
    return next;
  }

  private async createHost(): Promise<LanHost> {
    if (this.closed) throw new Error('the virtual LAN is torn down');
    const index = this.hosts.length;
    if (index > 240) throw new Error('the virtual LAN holds at most 241 hosts (.10-.250)');
    const n = this.names;
    const ns = n.hostNs(index);
    const port = n.hostPort(index);
    const host: LanHost = { index, namespace: ns, address: `${this.prefix}.${10 + index}`, rateMbit: rateOf(this.options, index) };
    this.hosts.push(host); // before the namespace exists, so that teardown removes a half-made one too
    await this.ip('netns', 'add', ns);
    await this.ip('-n', ns, 'link', 'set', 'lo', 'up');
    await this.ip('-n', n.lanNs, 'link', 'add', port, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    await this.ip('-n', n.lanNs, 'link', 'set', port, 'master', n.bridge, 'up');
    // An isolated port forwards only to ports that are not: the server's. Hosts see no one else.
    if (this.options.isolate) await this.ip('-n', n.lanNs, 'link', 'set', 'dev', port, 'type', 'bridge_slave', 'isolated', 'on');
    await this.ip('-n', ns, 'link', 'set', 'eth0', 'addrgenmode', 'none');
    await this.ip('-n', ns, 'addr', 'add', `${host.address}/24`, 'dev', 'eth0');
    await this.ip('-n', ns, 'link', 'set', 'eth0', 'up');
    await this.ip('-n', ns, 'route', 'add', 'default', 'via', this.gateway);
    // Each end shapes its own egress: eth0 the host's upload, the bridge port its download.
    await this.tc('-n', ns, 'qdisc', 'add', 'dev', 'eth0', 'root', ...tbfArgs(host.rateMbit));
    await this.tc('-n', n.lanNs, 'qdisc', 'add', 'dev', port, 'root', ...tbfArgs(host.rateMbit));
    return host;
  }

  /**
   * Starts the run's TURN relay (called once, by createLan, after `up`): coturn listening on the
   * server's address, relaying from the .1 of a second reserved /24, put on the launcher's veth
   * as a /32. Hosts route only their own /24 (and their default route goes nowhere), so no host
   * reaches the relay address: the relay talks to relays, and to the LAN's hosts only if they
   * could answer (with `isolate` they cannot).
   */
  async startTurn(): Promise<TurnProcess> {
    const binary = findTurnserver();
    const relayPrefix = reserveSubnet(this.tools.ip, this.tag);
    this.reservations.push(join(stateRoot(), `subnet-${relayPrefix}`));
    const relayAddress = `${relayPrefix}.1`;
    await this.ip('addr', 'add', `${relayAddress}/32`, 'dev', this.names.serverVeth);
    this.relayAddress = relayAddress;
    const prefix = this.prefix;
    this.turn = await TurnProcess.start(
      {
        listenIp: this.serverAddress,
        listenPort: await freeUdpPort(this.serverAddress, 3478),
        relayIp: relayAddress,
        minPort: RELAY_PORTS.min,
        maxPort: RELAY_PORTS.max,
        secret: newTurnSecret(),
        realm: TURN_REALM,
        // Exactly the run's addresses: the LAN's /24 and the relay's own.
        allowedPeers: [`${prefix}.0-${prefix}.255`, relayAddress],
        dir: this.stateDir,
      },
      { binary },
    );
    this.log(`lan: TURN relay (coturn, pid ${this.turn.pid}) at ${this.turn.url}, relaying from ${relayAddress}`);
    return this.turn;
  }

  /** What the server hands the ranks for the run's relay (undefined without one). */
  iceConfig(): IceConfig | undefined {
    return this.turn ? { turn: { secret: this.turn.secret, urls: [this.turn.url] } } : undefined;
  }

  /**
   * An executable that starts Chromium inside the host's namespace (for Playwright's
   * `executablePath`): `ip netns exec NS chromium "$@"`. `exec` keeps the pid and the pipes
   * Playwright talks over.
   */
  chromiumWrapper(host: LanHost, chromium: string): string {
    const path = join(this.stateDir, `chromium-${host.namespace}`);
    const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
    writeFileSync(path, `#!/bin/sh\nexec ${q(this.tools.ip)} netns exec ${q(host.namespace)} ${q(chromium)} "$@"\n`);
    chmodSync(path, 0o755);
    return path;
  }

  summary(ranks: Array<{ rank: number | undefined; host: LanHost; finished: boolean }>): LanSummary {
    const o = this.options;
    return {
      rateMbit: rateOf(o, Number.MAX_SAFE_INTEGER),
      ...(o.rates && new Set(o.rates).size > 1 ? { rates: o.rates } : {}),
      subnet: this.subnet,
      server: this.serverAddress,
      run: this.tag,
      ranks: ranks.map((r) => ({ rank: r.rank ?? null, address: r.host.address, rateMbit: r.host.rateMbit, finished: r.finished })),
      ...(o.isolate ? { isolated: true as const } : {}),
      ...(this.turn && this.relayAddress ? { turn: { url: this.turn.url, relay: this.relayAddress } } : {}),
    };
  }

  /** Everything of this run, in an order that removes interfaces at once (a namespace's own go when the kernel gets to it). */
  private teardownSteps(): Array<[string, string[]]> {
    const n = this.names;
    return [
      [this.tools.ip, ['link', 'del', n.serverVeth]],
      ...this.hosts.map((h): [string, string[]] => [this.tools.ip, ['-n', n.lanNs, 'link', 'del', n.hostPort(h.index)]]),
      ...this.hosts.map((h): [string, string[]] => [this.tools.ip, ['netns', 'del', h.namespace]]),
      [this.tools.ip, ['netns', 'del', n.lanNs]],
    ];
  }

  private finish(): void {
    if (this.finished) return;
    this.finished = true;
    rmSync(this.stateDir, { recursive: true, force: true });
    for (const r of this.reservations) rmSync(r, { force: true });
    this.reaper?.stdin?.end(); // nothing left for it: it exits
    untrack(this);
  }

  /** Tears the LAN down (idempotent). Chromium should be closed first; a namespace a process still runs in goes when that process exits. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.chain; // a host being made
    // The relay before the addresses it listens and relays on.
    await this.turn?.stop();
    for (const [bin, args] of this.teardownSteps()) await run(bin, args).catch(() => {});
    this.finish();
    this.log(`lan: removed ${this.names.lanNs} and ${this.hosts.length} host namespace(s)${this.turn ? ', stopped the TURN relay' : ''}`);
  }

  /** The same, synchronously (for the 'exit' handler; also finishes an asynchronous close under way). */
  closeSync(): void {
    if (this.finished) return;
    this.closed = true;
    this.turn?.stopSync();
    for (const [bin, args] of this.teardownSteps()) {
      try {
        runSync(bin, args);
      } catch {
        /* already gone */
      }
    }
    this.finish();
  }
}

/** Reads the root namespace's addresses and routes (what a /24 must not overlap). */
function rootPrefixes(ip: string): string[] {
  const out: string[] = [];
  for (const line of runSync(ip, ['-o', '-4', 'addr', 'show']).split('\n')) {
    const m = /\sinet\s+(\S+)/.exec(line);
    if (m) out.push(m[1]!);
  }
  for (const line of runSync(ip, ['-4', 'route', 'show', 'table', 'all']).split('\n')) {
    const first = line.trim().split(/\s+/);
    // "10.0.0.0/8 via ...", "local 10.1.2.3 dev ...", "broadcast ..."; "default" overlaps everything and is skipped.
    const dst = ['local', 'broadcast', 'unicast', 'multicast', 'anycast', 'blackhole', 'unreachable', 'prohibit', 'throw'].includes(first[0]!) ? first[1] : first[0];
    if (dst && dst !== 'default' && /^\d/.test(dst)) out.push(dst);
  }
  return out;
}

/** Reserves a free /24: a file created with O_EXCL, so that two runs starting at once get different ones. */
function reserveSubnet(ip: string, tag: string): string {
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

/**
 * Makes the LAN's bridge and the launcher's link into it; hosts come with `addHost()`. Sweeps
 * leftovers of dead runs first. On failure, removes whatever it made and rethrows.
 */
export async function createLan(options: LanOptions, log: (line: string) => void = () => {}): Promise<Lan> {
  rateOf(options, 0); // a rate is given
  const tools = checkLanSupport();
  const swept = sweepLeftovers(tools);
  if (swept.length > 0) log(`lan: removed leftovers of dead runs: ${swept.join(', ')}`);
  const tag = runTag(process.pid, runs++);
  const prefix = reserveSubnet(tools.ip, tag);
  const lan = new Lan(tag, prefix, options, tools, log);
  try {
    await lan.up();
  } catch (err) {
    await lan.close();
    throw new Error(`could not make the virtual LAN: ${(err as Error).message}`);
  }
  if (options.turn) {
    try {
      await lan.startTurn();
    } catch (err) {
      await lan.close();
      throw new Error(`could not start the TURN relay: ${(err as Error).message}`);
    }
  }
  return lan;
}
