/**
 * NAT traversal through a real TURN relay: Debian's coturn, started by the launcher (`--turn`),
 * on a virtual LAN whose hosts cannot reach each other (`--lan-isolate`: isolated bridge ports,
 * each host reaches only the server's address). Root and coturn only. Each test checks that the
 * run's relay is stopped and its namespaces, links and addresses are gone, also when the run fails.
 */
import { execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { launch, type LaunchOptions } from '../../launcher/run.ts';
import type { LanSummary } from '../../launcher/lan.ts';
import type { LinkSummary } from '../../launcher/summary_links.ts';
import { lanTestsBlocked } from '../fixtures/lan.ts';
import { expect, sessionName, test } from './fixtures.ts';

// Skipped without root or coturn (a developer's machine); CI has both and requires these (see lanTestsBlocked).
const blocked = lanTestsBlocked({ root: true, coturn: true });
test.skip(blocked !== undefined, `--lan-isolate --turn ${blocked}`);

/** turnserver processes started for the run (their command line names the run's folder). */
function turnservers(run: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmd = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmd.includes('turnserver') && cmd.includes(`/${run}/`)) pids.push(Number(entry));
    } catch {
      /* exited meanwhile */
    }
  }
  return pids;
}

function leftovers(lan: LanSummary): string[] {
  const out: string[] = [];
  const prefixes = [lan.subnet.replace(/\.0\/24$/, '.'), ...(lan.turn ? [lan.turn.relay.replace(/\.1$/, '.')] : [])];
  for (const ns of execFileSync('ip', ['netns', 'list']).toString().split('\n')) if (ns.startsWith(lan.run)) out.push(`netns ${ns}`);
  for (const l of execFileSync('ip', ['-o', 'link']).toString().split('\n'))
    if (l.includes(` ${lan.run}`)) out.push(`link ${l.slice(0, 40)}`);
  for (const a of execFileSync('ip', ['-o', '-4', 'addr']).toString().split('\n'))
    if (prefixes.some((p) => a.includes(` ${p}`))) out.push(`addr ${a.slice(0, 60)}`);
  for (const pid of turnservers(lan.run)) out.push(`turnserver pid ${pid}`);
  return out;
}

async function run(o: Partial<LaunchOptions> & Pick<LaunchOptions, 'nproc' | 'job' | 'jobParams' | 'lan'>) {
  const lines: string[] = [];
  const t0 = Date.now();
  const out = await launch({ session: sessionName('turn'), timeoutSec: 90, log: (l) => lines.push(l), ...o });
  console.log(`${o.job} on --lan ${JSON.stringify(o.lan)}: ${((Date.now() - t0) / 1000).toFixed(1)} s, ok ${out.ok}`);
  if (!out.ok) console.log(lines.slice(-30).join('\n'));
  const lan = out.summary.lan as LanSummary;
  expect(lan, JSON.stringify(out.summary)).toBeDefined();
  return { ...out, lan, lines };
}

test('isolated hosts train through coturn: every link relay <-> relay, the relay stopped afterwards', async () => {
  const { ok, summary, lan, lines } = await run({
    nproc: 2,
    job: 'train',
    lan: { rateMbit: 100, isolate: true, turn: true },
    // The cpu backend: this test is about the network, and SwiftShader's WebGPU is the slow part here.
    jobParams: { dataset: 'synthetic', trainSize: '512', batchSize: '32', epochs: '1', evalEvery: '0', backend: 'cpu' },
  });
  expect(ok, JSON.stringify(summary)).toBe(true);
  expect(summary.identical).toBe(true);
  expect(lan.isolated).toBe(true);
  expect(lan.turn?.url).toMatch(new RegExp(`^turn:${lan.server.replace(/\./g, '\\.')}:\\d+\\?transport=udp$`));
  // The relay's own address is on no network of the hosts.
  expect(lan.turn?.relay.startsWith(lan.subnet.replace(/0\/24$/, ''))).toBe(false);
  expect(lines.some((l) => /TURN relay \(coturn, pid \d+\)/.test(l))).toBe(true);
  const links = summary.links as LinkSummary[];
  expect(links.map((l) => [l.rank, l.peer])).toEqual([
    [0, 1],
    [1, 0],
  ]);
  for (const l of links) expect(l, JSON.stringify(links)).toMatchObject({ local: 'relay', remote: 'relay', protocol: 'udp' });
  await expect.poll(() => leftovers(lan), { timeout: 5_000 }).toEqual([]);
});

test('the same isolated hosts without a relay cannot connect: the link times out, saying a TURN relay is needed', async () => {
  const t0 = Date.now();
  const { ok, summary, lan } = await run({
    nproc: 2,
    job: 'allreduce',
    lan: { rateMbit: 100, isolate: true },
    timeoutSec: 40,
    // Hosts of one LAN link up in well under a second: 3 s would be plenty for a path that existed.
    jobParams: { sizes: '1000', iters: '1', linkTimeoutMs: '3000' },
  });
  expect(ok).toBe(false);
  const errors = JSON.stringify(summary.errors);
  expect(errors).toContain('waiting for a WebRTC link to rank');
  expect(errors).toContain('need a TURN relay');
  expect(Date.now() - t0).toBeLessThan(40_000);
  expect(lan.isolated).toBe(true);
  expect(lan.turn).toBeUndefined();
  await expect.poll(() => leftovers(lan), { timeout: 5_000 }).toEqual([]);
});

test('a run with a relay that fails (timeout) still stops coturn and removes its LAN', async () => {
  const { ok, summary, lan } = await run({
    nproc: 2,
    job: 'allreduce',
    lan: { rateMbit: 10, isolate: true, turn: true },
    // Short: the run cannot end in it (50 all-reduces of 4 MiB at 10 Mbit/s take over a minute).
    timeoutSec: 1,
    jobParams: { sizes: '1048576', iters: '50' },
  });
  expect(ok).toBe(false);
  expect(JSON.stringify(summary.errors)).toContain('timed out after 1 s');
  expect(lan.turn).toBeDefined();
  await expect.poll(() => leftovers(lan), { timeout: 5_000 }).toEqual([]);
});

test('the launcher killed outright (SIGKILL): its reaper stops coturn and removes the LAN', async () => {
  const child = spawn(
    'node_modules/.bin/tsx',
    [
      'launcher/launch.ts',
      '--nproc',
      '2',
      '--lan',
      '40',
      '--lan-isolate',
      '--turn',
      '--job',
      'allreduce',
      '--sizes',
      '4194304',
      '--iters',
      '20',
    ],
    {
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  try {
    await expect.poll(() => out, { timeout: 60_000 }).toContain('host 1 in namespace');
    const m = /lan: (10\.\d+\.\d+\.0\/24) \((ddp[0-9a-z]+-[0-9a-z]+)-lan\)/.exec(out)!;
    const relay = /relaying from (10\.\d+\.\d+\.1)/.exec(out)!;
    const lan = { subnet: m[1]!, run: m[2]!, turn: { url: '', relay: relay[1]! } } as LanSummary;
    expect(turnservers(lan.run)).toHaveLength(1);
    // Only the launcher's node process (tsx's child), not its process group: coturn and the reaper stay behind.
    const node = execFileSync('pgrep', ['-P', String(child.pid), '-f', 'launcher/launch.ts'])
      .toString()
      .trim()
      .split('\n')[0]!;
    process.kill(Number(node), 'SIGKILL');
    await expect.poll(() => leftovers(lan), { timeout: 10_000 }).toEqual([]);
  } finally {
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
});
