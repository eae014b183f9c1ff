/**
 * `--turn`: a TURN relay for the virtual LAN (launcher/lan.ts), Debian's coturn (`turnserver`)
 * started by the launcher in the root namespace. It listens on the LAN's server address, where
 * every rank reaches it, and relays from an address of its own that no rank has a route to, so a
 * relayed connection is relayed at both ends (relay <-> relay) and nothing else can carry it when
 * the ranks cannot reach each other (`--lan-isolate`).
 *
 * Authentication is coturn's `use-auth-secret` (the TURN REST API scheme): a random secret shared
 * with the launcher's server only, which mints each session's time-limited credentials
 * (signaling/ice.ts). The secret goes in a config file of the run's own (mode 0600), not on the
 * command line, where every user of the machine could read it. No file of /etc is read.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createSocket } from 'node:dgram';
import { accessSync, constants, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** Where a run's relay listens and relays, and whom it relays to. */
export interface TurnSettings {
  /** The address ranks reach it at (the LAN's server address). */
  listenIp: string;
  listenPort: number;
  /** The address relayed packets leave from: an address no rank can reach. */
  relayIp: string;
  /** UDP ports of relay endpoints (one per allocation). */
  minPort: number;
  maxPort: number;
  /** coturn's static-auth-secret. */
  secret: string;
  realm: string;
  /** Peer addresses the relay may send to, as coturn ranges ("a.b.c.d" or "a.b.c.d-e.f.g.h"); everything else is denied. */
  allowedPeers: string[];
  /** The run's own folder: the config file, coturn's pid file and database go there. */
  dir: string;
}

export const TURN_REALM = 'browser-ddp';
/** Relay ports: a fixed range, on an address of the run's own, so no other program's ports matter. */
export const RELAY_PORTS = { min: 49152, max: 49651 } as const;

/**
 * coturn's configuration for a run (the lines of a turnserver.conf). What each line is for:
 * - use-auth-secret + static-auth-secret: credentials minted by the server, never stored by coturn;
 * - listening-ip/-port and relay-ip: exactly the run's addresses, nothing on the machine's own;
 * - no-tls, no-dtls, no-tcp, no-tcp-relay: plain UDP, what the ranks use (no certificate needed);
 * - no-cli: coturn's telnet CLI would listen on 127.0.0.1:5766 (and collide between runs);
 * - no-rfc5780: no second listening port for NAT-behaviour discovery;
 * - denied-peer-ip for everything, allowed-peer-ip for the run's own addresses: the relay cannot be
 *   used to reach anything else (coturn allows listed ranges before it denies);
 * - pidfile, userdb in the run's folder: coturn's defaults are under /var.
 */
export function turnserverConfig(s: TurnSettings): string {
  return [
    `listening-ip=${s.listenIp}`,
    `listening-port=${s.listenPort}`,
    `relay-ip=${s.relayIp}`,
    `min-port=${s.minPort}`,
    `max-port=${s.maxPort}`,
    'use-auth-secret',
    `static-auth-secret=${s.secret}`,
    `realm=${s.realm}`,
    'no-tls',
    'no-dtls',
    'no-tcp',
    'no-tcp-relay',
    'no-cli',
    'no-rfc5780',
    'no-software-attribute',
    'no-multicast-peers',
    'denied-peer-ip=0.0.0.0-255.255.255.255',
    'denied-peer-ip=::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
    ...s.allowedPeers.map((p) => `allowed-peer-ip=${p}`),
    'log-file=stdout',
    'simple-log',
    `pidfile=${join(s.dir, 'turnserver.coturn.pid')}`,
    `userdb=${join(s.dir, 'turndb')}`,
    '',
  ].join('\n');
}

/** The `turnserver` binary, or an error saying how to get it. */
export function findTurnserver(): string {
  for (const dir of [...(process.env.PATH ?? '').split(':').filter(Boolean), '/usr/bin', '/usr/sbin', '/usr/local/bin']) {
    const p = join(dir, 'turnserver');
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      /* next */
    }
  }
  throw new Error(
    "--turn needs coturn's turnserver: apt-get install -y coturn (the launcher starts its own, with its own configuration; the system service need not run)",
  );
}

/** A STUN Binding request (RFC 5389): type, zero length, the magic cookie, a 96-bit transaction id. */
export function stunBindingRequest(transactionId: Buffer): Buffer {
  if (transactionId.length !== 12) throw new Error('a STUN transaction id is 12 bytes');
  const b = Buffer.alloc(20);
  b.writeUInt16BE(0x0001, 0);
  b.writeUInt16BE(0, 2);
  b.writeUInt32BE(0x2112a442, 4);
  transactionId.copy(b, 8);
  return b;
}

/** True for a Binding success response to `transactionId`. */
export function isStunBindingSuccess(msg: Buffer, transactionId: Buffer): boolean {
  return (
    msg.length >= 20 && msg.readUInt16BE(0) === 0x0101 && msg.readUInt32BE(4) === 0x2112a442 && msg.subarray(8, 20).equals(transactionId)
  );
}

/** Resolves once a STUN server answers a Binding request at ip:port (asking again every 200 ms), rejects after `timeoutMs`. */
export function waitForStun(ip: string, port: number, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = createSocket('udp4');
    const tid = randomBytes(12);
    const request = stunBindingRequest(tid);
    let done = false;
    const finish = (err?: Error) => {
      if (done) return;
      done = true;
      clearInterval(ask);
      clearTimeout(timer);
      socket.close();
      if (err) reject(err);
      else resolve();
    };
    socket.on('message', (msg) => {
      if (isStunBindingSuccess(msg, tid)) finish();
    });
    // ICMP port-unreachable surfaces as ECONNREFUSED on some sends until coturn listens: keep asking.
    socket.on('error', () => {});
    const send = () => socket.send(request, port, ip, () => {});
    const ask = setInterval(send, 200);
    const timer = setTimeout(
      () => finish(new Error(`timed out after ${timeoutMs} ms waiting for coturn to answer a STUN Binding request on ${ip}:${port}`)),
      timeoutMs,
    );
    send();
  });
}

/** A UDP port free on `ip`: `preferred` if nothing holds it (the standard 3478 reads well in logs), else one the system picks. */
export async function freeUdpPort(ip: string, preferred: number): Promise<number> {
  const tryBind = (port: number) =>
    new Promise<number | undefined>((resolve) => {
      const s = createSocket('udp4');
      s.once('error', () => {
        s.close();
        resolve(undefined);
      });
      s.bind(port, ip, () => {
        const p = s.address().port;
        s.close(() => resolve(p));
      });
    });
  const port = (await tryBind(preferred)) ?? (await tryBind(0));
  if (port === undefined) throw new Error(`no free UDP port on ${ip} for the TURN relay`);
  return port;
}

/** A running coturn of one run. */
export class TurnProcess {
  /** Where ranks reach it: turn:IP:PORT?transport=udp */
  readonly url: string;
  /** The shared secret: only for the launcher's server. */
  readonly secret: string;
  private readonly lines: string[] = [];
  private exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  private readonly exitedP: Promise<void>;

  private constructor(
    readonly settings: TurnSettings,
    private readonly child: ChildProcess,
  ) {
    this.url = `turn:${settings.listenIp}:${settings.listenPort}?transport=udp`;
    this.secret = settings.secret;
    const keep = (chunk: Buffer) => {
      for (const line of chunk.toString().split('\n')) if (line.trim()) this.lines.push(line.trimEnd());
      // The last lines say why it failed; the rest is noise.
      if (this.lines.length > 60) this.lines.splice(0, this.lines.length - 60);
    };
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    this.exitedP = new Promise((resolve) => {
      child.on('exit', (code, signal) => {
        this.exited = { code, signal };
        resolve();
      });
      child.on('error', (err) => {
        this.lines.push(`could not start turnserver: ${err.message}`);
        this.exited ??= { code: null, signal: null };
        resolve();
      });
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** coturn's last lines of output (for error messages). */
  tail(n = 15): string {
    return this.lines.slice(-n).join('\n');
  }

  /**
   * Starts coturn with `settings` (the config file and a pid file go to `settings.dir`) and waits
   * until it answers STUN on its listening address. On failure it is stopped again and the error
   * carries coturn's last lines.
   */
  static async start(settings: TurnSettings, opts: { binary?: string; readyTimeoutMs?: number } = {}): Promise<TurnProcess> {
    const binary = opts.binary ?? findTurnserver();
    const conf = join(settings.dir, 'turnserver.conf');
    writeFileSync(conf, turnserverConfig(settings), { mode: 0o600 });
    // -c: this file only (coturn would otherwise look for /etc/turnserver.conf).
    const child = spawn(binary, ['-c', conf], { stdio: ['ignore', 'pipe', 'pipe'] });
    const turn = new TurnProcess(settings, child);
    // For the reaper (launcher/lan.ts): the pid, checked against the command line before a kill.
    if (child.pid !== undefined) writeFileSync(join(settings.dir, 'turnserver.pid'), `${child.pid}\n`);
    const timeoutMs = opts.readyTimeoutMs ?? 10_000;
    try {
      await Promise.race([
        waitForStun(settings.listenIp, settings.listenPort, timeoutMs),
        turn.exitedP.then(() => {
          throw new Error(
            `turnserver exited (${turn.exited?.signal ?? `code ${turn.exited?.code}`}) before it answered on ${settings.listenIp}:${settings.listenPort}`,
          );
        }),
      ]);
    } catch (err) {
      await turn.stop();
      throw new Error(`${(err as Error).message} (the address must be this machine's and the UDP port free); coturn said:\n${turn.tail()}`);
    }
    return turn;
  }

  /** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
  async stop(graceMs = 3_000): Promise<void> {
    if (this.exited) return;
    this.child.kill('SIGTERM');
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), graceMs)));
    if ((await Promise.race([this.exitedP, late])) === 'late') {
      this.child.kill('SIGKILL');
      await this.exitedP;
    }
    clearTimeout(timer);
  }

  /** For the process's 'exit' handler: no waiting possible there. */
  stopSync(): void {
    if (!this.exited) this.child.kill('SIGKILL');
  }
}

/** A secret for coturn's static-auth-secret: 256 random bits. */
export function newTurnSecret(): string {
  return randomBytes(32).toString('base64url');
}

/**
 * Kills the turnserver a run started, from the pid file in its folder, if that pid is still a
 * turnserver whose command line names the folder (so a recycled pid is left alone). For the
 * sweep of dead runs' leftovers; returns whether it killed one.
 */
export function killRunTurnserver(runDir: string): boolean {
  try {
    const pid = Number(readFileSync(join(runDir, 'turnserver.pid'), 'utf8').trim());
    if (!Number.isSafeInteger(pid) || pid <= 1) return false;
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    if (!cmdline.includes('turnserver') || !cmdline.includes(runDir)) return false;
    process.kill(pid, 'SIGKILL');
    return true;
  } catch {
    return false;
  }
}
