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
 *
 * The parts: lan_shaping.ts (rates, tbf), lan_names.ts (run tags, names, subnet choice),
 * lan_tools.ts (running ip and tc), lan_state.ts (state root, subnet reservations, the sweep),
 * lan_reaper.ts (teardown on exit, signals and the reaper); this module makes and tears down a run.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { lanNames, runTag } from './lan_names.ts';
import { startReaper, track, untrack } from './lan_reaper.ts';
import { rateOf, tbfArgs, type LanOptions } from './lan_shaping.ts';
import { reserveSubnet, stateRoot, sweepLeftovers } from './lan_state.ts';
import { checkLanSupport, run, runSync } from './lan_tools.ts';
import { findTurnserver, freeUdpPort, newTurnSecret, RELAY_PORTS, TURN_REALM, TurnProcess } from './turn.ts';
import type { IceConfig } from '../signaling/ice.ts';

// What importers take from here (the unit tests take the pure parts from here too).
export {
  MAX_DELAY_MS,
  MAX_RATE_MBIT,
  MIN_RATE_MBIT,
  parseDelay,
  parseRate,
  parseRates,
  rateOf,
  tbfArgs,
  type LanOptions,
} from './lan_shaping.ts';
export { chooseSubnet, cidrRange, lanNames, ownerPid, runOfName, runTag } from './lan_names.ts';
export { checkLanSupport } from './lan_tools.ts';
export { sweepLeftovers } from './lan_state.ts';

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
  /** Each host's one-way delay out (`delayMs`). */
  delayMs?: number;
}

let runs = 0;

/** `delayMs`: the delay line's TUN device in each host, the mark of the packets it sends on, and the script. */
const DELAY_DEV = 'dly0';
const DELAY_MARK = 1;
const DELAY_SCRIPT = fileURLToPath(new URL('./lan_delay.py', import.meta.url));

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
  /** `delayMs`: each host's delay line (lan_delay.py), which exits when its stdin closes. */
  private readonly delayLines: ChildProcess[] = [];

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
    if (this.options.delayMs !== undefined) await this.addDelay(host, this.options.delayMs);
    return host;
  }

  /**
   * `delayMs`: the host's packets to the LAN go to a TUN device whose user-space end
   * (lan_delay.py) holds each one, then sends it out of eth0 through a raw socket marked
   * DELAY_MARK; a policy rule routes marked packets by the real link, the others by the TUN.
   * Replies come in by eth0 directly, so the line turns the namespace's reverse-path filter off.
   */
  private async addDelay(host: LanHost, delayMs: number): Promise<void> {
    const ns = host.namespace;
    await this.ip('-n', ns, 'tuntap', 'add', 'dev', DELAY_DEV, 'mode', 'tun');
    // IPv4 only, as eth0: no link-local IPv6 address for WebRTC to gather a candidate on.
    await this.ip('-n', ns, 'link', 'set', DELAY_DEV, 'addrgenmode', 'none');
    await this.ip('-n', ns, 'link', 'set', DELAY_DEV, 'up');
    await this.ip('-n', ns, 'route', 'add', this.subnet, 'dev', 'eth0', 'table', '100');
    await this.ip('-n', ns, 'rule', 'add', 'fwmark', String(DELAY_MARK), 'lookup', '100', 'pref', '100');
    await this.ip('-n', ns, 'route', 'add', this.subnet, 'dev', DELAY_DEV, 'src', host.address, 'table', '200');
    await this.ip('-n', ns, 'rule', 'add', 'not', 'fwmark', String(DELAY_MARK), 'lookup', '200', 'pref', '200');
    const line = spawn(
      this.tools.ip,
      ['netns', 'exec', ns, '/usr/bin/python3', DELAY_SCRIPT, DELAY_DEV, String(delayMs), String(DELAY_MARK)],
      { stdio: ['pipe', 'pipe', 'pipe'] },
    );
    this.delayLines.push(line);
    // It says so once the TUN is open; until then packets to the LAN would go nowhere.
    await new Promise<void>((resolve, reject) => {
      let err = '';
      const timer = setTimeout(() => reject(new Error(`the delay line of ${ns} did not start within 10 s: ${err.trim()}`)), 10_000);
      line.stdout!.once('data', () => {
        clearTimeout(timer);
        resolve();
      });
      line.stderr!.on('data', (d: Buffer) => {
        err = (err + String(d)).slice(-2000);
      });
      line.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`the delay line of ${ns} exited (${code}): ${err.trim()}`));
        // The host is cut off from the LAN from here: say so (a teardown's exit is expected).
        if (!this.closed) this.log(`lan: the delay line of ${ns} exited (${code}) during the run: ${err.trim().slice(-300)}`);
      });
    });
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
      ...(this.options.delayMs === undefined ? {} : { delayMs: this.options.delayMs }),
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

  private stopDelayLines(): void {
    for (const line of this.delayLines) {
      line.stdin?.end();
      line.kill('SIGTERM');
    }
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
    this.stopDelayLines();
    for (const [bin, args] of this.teardownSteps()) await run(bin, args).catch(() => {});
    this.finish();
    this.log(`lan: removed ${this.names.lanNs} and ${this.hosts.length} host namespace(s)${this.turn ? ', stopped the TURN relay' : ''}`);
  }

  /** The same, synchronously (for the 'exit' handler; also finishes an asynchronous close under way). */
  closeSync(): void {
    if (this.finished) return;
    this.closed = true;
    this.turn?.stopSync();
    this.stopDelayLines();
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
