/**
 * `--turn` (launcher/turn.ts): coturn's configuration, the STUN probe, and the real turnserver
 * started and stopped on loopback (no root needed; skipped without coturn). That ranks really
 * connect through it, relay at both ends, is test/e2e/turn.spec.ts (root).
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runTag } from '../launcher/lan.ts';
import { linksOf } from '../launcher/summary_links.ts';
import { iceServersFor } from '../signaling/ice.ts';
import {
  findTurnserver,
  freeUdpPort,
  isStunBindingSuccess,
  killRunTurnserver,
  stunBindingRequest,
  turnserverConfig,
  TurnProcess,
  type TurnSettings,
} from '../launcher/turn.ts';
import { lanTestsBlocked } from './fixtures/lan.ts';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
function runDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'ddp-turn-test-'));
  dirs.push(d);
  return d;
}

const settings = (dir: string, over: Partial<TurnSettings> = {}): TurnSettings => ({
  listenIp: '127.0.0.1',
  listenPort: 3478,
  relayIp: '127.0.0.1',
  minPort: 49152,
  maxPort: 49651,
  secret: 'a-secret-of-at-least-16-chars',
  realm: 'browser-ddp',
  allowedPeers: ['10.9.8.0-10.9.8.255', '10.9.9.1'],
  dir,
  ...over,
});

/** The turnservers whose command line names `dir`. */
function turnserversOf(dir: string): number[] {
  return readdirSync('/proc')
    .filter((e) => /^\d+$/.test(e))
    .filter((e) => {
      try {
        const cmd = readFileSync(`/proc/${e}/cmdline`, 'utf8');
        return cmd.includes('turnserver') && cmd.includes(dir);
      } catch {
        return false;
      }
    })
    .map(Number);
}

describe('coturn configuration', () => {
  it("authenticates with a shared secret, listens and relays on the run's addresses only, relays only to the run's peers", () => {
    const lines = turnserverConfig(settings('/run/x/ddp1-0')).split('\n');
    for (const line of [
      'listening-ip=127.0.0.1',
      'listening-port=3478',
      'relay-ip=127.0.0.1',
      'min-port=49152',
      'max-port=49651',
      'use-auth-secret',
      'static-auth-secret=a-secret-of-at-least-16-chars',
      'realm=browser-ddp',
      'no-tls',
      'no-dtls',
      'no-cli',
      'no-rfc5780',
      'denied-peer-ip=0.0.0.0-255.255.255.255',
      'allowed-peer-ip=10.9.8.0-10.9.8.255',
      'allowed-peer-ip=10.9.9.1',
      'pidfile=/run/x/ddp1-0/turnserver.coturn.pid',
      'userdb=/run/x/ddp1-0/turndb',
    ]) {
      expect(lines).toContain(line);
    }
    // Nothing else is listened on: no TCP, TLS or DTLS listener, no CLI.
    expect(lines.filter((l) => l.startsWith('listening-'))).toHaveLength(2);
  });
});

describe('STUN probe', () => {
  it('asks with a Binding request and knows its own answer', () => {
    const tid = randomBytes(12);
    const req = stunBindingRequest(tid);
    expect(req.length).toBe(20);
    expect(req.readUInt16BE(0)).toBe(0x0001);
    expect(req.readUInt32BE(4)).toBe(0x2112a442);
    const answer = Buffer.from(req);
    answer.writeUInt16BE(0x0101, 0);
    expect(isStunBindingSuccess(answer, tid)).toBe(true);
    expect(isStunBindingSuccess(answer, randomBytes(12))).toBe(false);
    expect(isStunBindingSuccess(req, tid)).toBe(false);
    expect(isStunBindingSuccess(answer.subarray(0, 12), tid)).toBe(false);
    expect(() => stunBindingRequest(Buffer.alloc(4))).toThrow(/12 bytes/);
  });
});

const coturn = (() => {
  try {
    return findTurnserver();
  } catch {
    return undefined;
  }
})();

// Skipped without coturn or root (a developer's machine); CI has both and requires these (see lanTestsBlocked).
describe.skipIf(lanTestsBlocked({ root: false, coturn: true }) !== undefined)('the real turnserver', () => {
  it('starts from its own config file (secret not on the command line), answers STUN, and stops', async () => {
    const dir = runDir();
    const port = await freeUdpPort('127.0.0.1', 0);
    const s = settings(dir, { listenPort: port, secret: randomBytes(24).toString('base64url') });
    const turn = await TurnProcess.start(s);
    try {
      expect(turn.url).toBe(`turn:127.0.0.1:${port}?transport=udp`);
      expect(statSync(join(dir, 'turnserver.conf')).mode & 0o777).toBe(0o600);
      const pid = turn.pid!;
      expect(turnserversOf(dir)).toEqual([pid]);
      expect(readFileSync(`/proc/${pid}/cmdline`, 'utf8')).not.toContain(s.secret);
      expect(readFileSync(join(dir, 'turnserver.pid'), 'utf8').trim()).toBe(String(pid));
    } finally {
      await turn.stop();
    }
    expect(turnserversOf(dir)).toEqual([]);
  });

  it("a relay that cannot listen fails within the bound, with coturn's own words, and is stopped", async () => {
    const dir = runDir();
    // An address of no interface here: coturn cannot bind it.
    const err = await TurnProcess.start(settings(dir, { listenIp: '192.0.2.77', relayIp: '192.0.2.77', listenPort: 3478 }), {
      readyTimeoutMs: 2_000,
    }).then(
      () => new Error('started'),
      (e: Error) => e,
    );
    expect(err.message).toMatch(/192\.0\.2\.77:3478/);
    expect(err.message).toContain('coturn said:');
    expect(turnserversOf(dir)).toEqual([]);
  });

  it("the sweep kills a dead run's turnserver by its pid file, and leaves a pid that is not one alone", async () => {
    const dir = runDir();
    const turn = await TurnProcess.start(settings(dir, { listenPort: await freeUdpPort('127.0.0.1', 0) }));
    try {
      expect(killRunTurnserver(dir)).toBe(true);
      await expect.poll(() => turnserversOf(dir), { timeout: 5_000 }).toEqual([]);
    } finally {
      await turn.stop();
    }
    const other = runDir();
    writeFileSync(join(other, 'turnserver.pid'), `${process.pid}\n`);
    expect(killRunTurnserver(other)).toBe(false);
  });
});

/**
 * coturn in a network namespace of the test's own (two addresses on a veth pair), driven by
 * coturn's own client, turnutils_uclient: it allocates a relay with the credentials the server
 * mints (signaling/ice.ts) and sends through it to a peer address. Root only.
 */
describe.skipIf(lanTestsBlocked({ root: true, coturn: true }) !== undefined)("the relay with the server's credentials (root)", () => {
  const ns = `${runTag(process.pid, 46_000)}-turntest`;
  const secret = randomBytes(24).toString('base64url');
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'pipe'], timeout: 15_000 }).toString();

  /** Starts coturn in the namespace with `allowedPeers`, runs the client once per login (username, credential), stops coturn; returns what they said. */
  async function relay(allowedPeers: string[], logins: Array<[string, string]>): Promise<{ clients: string[]; server: string }> {
    const dir = runDir();
    writeFileSync(
      join(dir, 'turnserver.conf'),
      turnserverConfig(settings(dir, { listenIp: '10.0.0.1', relayIp: '10.0.0.1', secret, allowedPeers })),
      { mode: 0o600 },
    );
    const proc = spawn('ip', ['netns', 'exec', ns, coturn!, '-c', join(dir, 'turnserver.conf')], { stdio: ['ignore', 'pipe', 'pipe'] });
    let server = '';
    proc.stdout.on('data', (d: Buffer) => (server += d.toString()));
    proc.stderr.on('data', (d: Buffer) => (server += d.toString()));
    try {
      // Ready when it answers STUN (the client would only say it could not allocate).
      for (let attempt = 0; ; attempt++) {
        if (
          spawnSync('ip', ['netns', 'exec', ns, 'timeout', '1', 'turnutils_stunclient', '-p', '3478', '10.0.0.1'], { timeout: 5_000 })
            .status === 0
        )
          break;
        if (attempt >= 30) throw new Error(`coturn did not answer STUN in the test namespace; it said:\n${server.slice(-2000)}`);
        await new Promise((res) => setTimeout(res, 200)); // between STUN probes of a coturn starting up: a bounded poll
      }
      const clients = logins.map(([username, credential]) => {
        const r = spawnSync(
          'ip',
          ['netns', 'exec', ns, 'turnutils_uclient', '-y', '-n', '3', '-u', username, '-w', credential, '-p', '3478', '10.0.0.1'],
          { timeout: 20_000 },
        );
        return `${r.stdout}${r.stderr}`;
      });
      return { clients, server };
    } finally {
      proc.kill('SIGKILL');
      await new Promise((res) => (proc.exitCode !== null ? res(undefined) : proc.once('exit', res)));
    }
  }

  afterAll(() => {
    try {
      ip('netns', 'del', ns);
    } catch {
      /* never made */
    }
  });

  it('relays between relay addresses when they are allowed, refuses peers that are not, and credentials not minted with the secret', async () => {
    ip('netns', 'add', ns);
    ip('-n', ns, 'link', 'set', 'lo', 'up');
    ip('-n', ns, 'link', 'add', 'name', 'va', 'type', 'veth', 'peer', 'name', 'vb');
    ip('-n', ns, 'addr', 'add', '10.0.0.1/24', 'dev', 'va');
    ip('-n', ns, 'addr', 'add', '10.0.0.2/24', 'dev', 'vb');
    ip('-n', ns, 'link', 'set', 'va', 'up');
    ip('-n', ns, 'link', 'set', 'vb', 'up');
    const [minted] = iceServersFor({ turn: { secret, urls: ['turn:10.0.0.1:3478'] } }, 'a-session');
    // -y: two clients relay to each other's relay address, as two ranks do through --turn.
    const credential = minted!.credential!;
    const forged = `${credential[0] === 'A' ? 'B' : 'A'}${credential.slice(1)}`;
    // One coturn for the minted login and a forged one: coturn answered STUN before both.
    const {
      clients: [allowed, wrong],
    } = await relay(
      ['10.0.0.1'],
      [
        [minted!.username!, credential],
        [minted!.username!, forged],
      ],
    );
    expect(allowed, allowed).toMatch(/tot_recv_msgs=[1-9]/);
    expect(wrong, wrong).not.toMatch(/tot_recv_msgs=[1-9]/);
    // The allocation fails on the credential (coturn answers 401 to each try).
    expect(wrong).toContain('Cannot complete Allocation');
    const {
      clients: [denied],
    } = await relay(['10.0.0.2'], [[minted!.username!, credential]]);
    expect(denied, denied).toContain('403 (Forbidden IP)');
    expect(denied).not.toMatch(/tot_recv_msgs=[1-9]/);
  }, 60_000);
});

describe("the launcher's links summary", () => {
  it("lists each rank's links, checking what a page sent", () => {
    const ranks = [
      { rank: 1, links: [{ peer: 0, local: 'relay', remote: 'relay', protocol: 'udp', rttMs: 3 }] },
      { rank: 0, links: [{ peer: 1, local: 'host', remote: '<script>', protocol: 'sctp', rttMs: 'fast' }, 'junk', { peer: 'x' }] },
      { rank: 2 },
    ];
    expect(linksOf(ranks)).toEqual({
      links: [
        { rank: 0, peer: 1, local: 'host', remote: null, protocol: null, rttMs: null },
        { rank: 1, peer: 0, local: 'relay', remote: 'relay', protocol: 'udp', rttMs: 3 },
      ],
    });
    expect(linksOf([{ rank: 0 }])).toEqual({});
  });
});
