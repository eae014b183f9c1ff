/** The pure parts of `--lan` (launcher/lan.ts): rates, names, subnet choice. The LAN itself is in test/e2e/lan.spec.ts (root). */
import { describe, expect, it } from 'vitest';
import {
  chooseSubnet,
  cidrRange,
  lanNames,
  ownerPid,
  parseDelay,
  parseRate,
  parseRates,
  rateOf,
  runOfName,
  runTag,
  tbfArgs,
} from '../launcher/lan.ts';
import { secureOriginArgs } from '../launcher/lan_driver.ts';

describe('--lan rates', () => {
  it('takes a rate in Mbit/s and refuses nonsense, naming the flag', () => {
    expect(parseRate('--lan', '40')).toBe(40);
    expect(parseRate('--lan', '2.5')).toBe(2.5);
    for (const bad of ['0', '-3', 'fast', '', undefined, '1e9'])
      expect(() => parseRate('--lan', bad)).toThrow(/--lan takes a link rate in Mbit\/s/);
  });

  it('--lan-rates gives one rate per rank; a wrong count names both flags and both numbers', () => {
    expect(parseRates('100,100,20', 3)).toEqual([100, 100, 20]);
    expect(parseRates(' 10 , 20 ', 2)).toEqual([10, 20]);
    expect(() => parseRates('100,100,20', 4)).toThrow('--lan-rates gives 3 rate(s) (100,100,20) but --nproc is 4');
    expect(() => parseRates('100,,20', 3)).toThrow(/--lan-rates \(item 2\)/);
  });

  it('a host takes its own rate, else --lan, else the slowest listed (ranks opened by --join)', () => {
    expect(rateOf({ rateMbit: 40 }, 7)).toBe(40);
    expect(rateOf({ rates: [100, 20] }, 1)).toBe(20);
    expect(rateOf({ rates: [100, 20] }, 2)).toBe(20);
    expect(rateOf({ rates: [100, 50], rateMbit: 80 }, 2)).toBe(80);
    expect(() => rateOf({}, 0)).toThrow(/needs a rate/);
  });

  it('--lan-delay takes a one-way delay of 1-1000 ms', () => {
    expect(parseDelay('40')).toBe(40);
    expect(parseDelay('2.5')).toBe(2.5);
    for (const bad of ['0', '-3', 'slow', '', undefined, '1001'])
      expect(() => parseDelay(bad)).toThrow(/--lan-delay takes each host's one-way delay in ms, 1-1000/);
  });

  it('shapes with the verified tbf recipe, the burst growing with fast links', () => {
    expect(tbfArgs(24)).toEqual(['tbf', 'rate', '24000kbit', 'burst', '65536', 'latency', '200ms']);
    expect(Number(tbfArgs(1000)[4])).toBe(625_000);
  });
});

describe('--lan names', () => {
  it('every interface name fits IFNAMSIZ and carries the owner pid', () => {
    const tag = runTag(4_194_304, 36 ** 3 - 1); // the largest pid_max, the largest run number
    const n = lanNames(tag);
    for (const name of [n.serverVeth, n.bridge, n.hostPort(240), n.serverPort, 'eth0']) expect(name.length).toBeLessThanOrEqual(15);
    for (const name of [n.lanNs, n.hostNs(3), n.serverVeth, tag]) expect(ownerPid(name)).toBe(4_194_304);
    expect(runTag(1234, 0)).not.toBe(runTag(1234, 1));
    expect(ownerPid('eth0')).toBeUndefined();
    expect(ownerPid('ddp')).toBeUndefined();
  });

  it("a name tells its run only in the shapes a run makes (the sweep then also needs the run's own record)", () => {
    const tag = runTag(4_194_304, 36 ** 3 - 1);
    const n = lanNames(tag);
    for (const name of [n.lanNs, n.hostNs(0), n.hostNs(240), n.serverVeth]) expect(runOfName(name)).toBe(tag);
    for (const name of ['eth0', tag, `${tag}-other`, `${tag}x`, 'ddpabc-1-lan-2']) expect(runOfName(name)).toBeUndefined();
  });
});

describe('--lan subnet', () => {
  it('parses prefixes and addresses', () => {
    expect(cidrRange('10.200.3.7/24')).toEqual([0x0ac80300, 0x0ac803ff]);
    expect(cidrRange('192.0.2.2')).toEqual([0xc0000202, 0xc0000202]);
    expect(cidrRange('default')).toBeUndefined();
    expect(cidrRange('300.1.1.1/8')).toBeUndefined();
  });

  it('skips /24s that an address or a route overlaps, and reserved ones', () => {
    expect(chooseSubnet([], new Set(), 0)).toBe('10.200.0');
    expect(chooseSubnet(['10.200.0.1/24'], new Set(), 0)).toBe('10.200.1');
    expect(chooseSubnet(['10.200.0.0/23'], new Set(['10.200.2']), 0)).toBe('10.200.3');
    expect(chooseSubnet(['10.200.0.0/16'], new Set(), 0)).toBe('10.201.0');
    expect(chooseSubnet(['127.0.0.1/8', '192.0.2.2/24', '0.0.0.0/0'], new Set(), 5)).toBe('10.200.5');
    // A VPN's 10.0.0.0/8 leaves nothing in 10/8.
    expect(() => chooseSubnet(['10.0.0.0/8'], new Set(), 0)).toThrow(/no free \/24/);
  });
});

describe('--lan browsers', () => {
  it('treat a plain-http server origin as secure (for WebGPU), an https one as it is', () => {
    expect(secureOriginArgs('http://10.200.3.1:41234')).toEqual(['--unsafely-treat-insecure-origin-as-secure=http://10.200.3.1:41234']);
    expect(secureOriginArgs('https://10.200.3.1:41234')).toEqual([]);
  });
});
