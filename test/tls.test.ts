/**
 * HTTPS: the self-signed certificate kept for this machine (covers its names and addresses, is
 * reused, is remade when it no longer covers them), bad TLS_CERT/TLS_KEY stopping the start with
 * a message naming the file, and the real server over https and wss with real clients.
 */
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { X509Certificate, createHash, createPublicKey } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { hostname, networkInterfaces, tmpdir, type NetworkInterfaceInfo } from 'node:os';
import { join } from 'node:path';
import { WebSocket } from 'ws';
import { ServerStartError, startServer, PROJECT_ROOT, type RunningServer } from '../signaling/server.ts';
import {
  certificateNames,
  keptCertificate,
  machineNames,
  makeSelfSigned,
  readTlsFiles,
  spkiSha256,
  tlsFromEnv,
  trustLines,
} from '../signaling/tls.ts';
import { trustArgs } from '../launcher/browser.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { ConnectionClosedError } from '../src/wire/errors.ts';
import { connect, rawRequest, testCertificate, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';

const servers: RunningServer[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
});

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
const tempDir = () => {
  const dir = mkdtempSync(join(tmpdir(), 'ddp-tls-test-'));
  dirs.push(dir);
  return dir;
};
const lines = (): { log: (l: string) => void; seen: string[] } => {
  const seen: string[] = [];
  return { log: (l) => seen.push(l), seen };
};

/** A GET over https trusting `ca`. */
const get = (url: string, ca: string, headers: Record<string, string> = {}) => rawRequest(url, { ca, headers });

/** A wss upgrade with these headers: 101 when it opens, else the refusal's status. */
function upgrade(url: string, ca: string, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${url.replace(/^https/, 'wss')}ws`, { ca, headers });
    ws.on('open', () => {
      ws.close();
      resolve(101);
    });
    ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
    ws.on('error', reject);
  });
}

describe('the kept self-signed certificate', () => {
  it("covers this machine's names and addresses (not IPv6 link-local ones)", () => {
    const iface = (address: string, family: 'IPv4' | 'IPv6'): NetworkInterfaceInfo =>
      ({
        address,
        family,
        internal: false,
        netmask: '',
        mac: '',
        cidr: null,
        ...(family === 'IPv6' ? { scopeid: 0 } : {}),
      }) as NetworkInterfaceInfo;
    const names = machineNames({ eth0: [iface('192.168.1.20', 'IPv4'), iface('fe80::1', 'IPv6'), iface('fd00::20', 'IPv6')] }, 'LabHost');
    expect(names.dns).toEqual(['localhost', 'labhost', 'labhost.local']);
    expect(names.ips).toEqual(['127.0.0.1', '::1', '192.168.1.20', 'fd00::20']);
    expect(machineNames({}, 'lab.example.org').dns).toEqual(['localhost', 'lab.example.org']);
    // Names the server is told to answer to must be in its certificate too.
    const allowed = certificateNames({ ALLOWED_HOSTS: 'DDP.lab.example, 203.0.113.5,[fd00::7]' });
    expect(allowed.dns).toContain('ddp.lab.example');
    expect(allowed.ips).toEqual(expect.arrayContaining(['203.0.113.5', 'fd00::7']));
  });

  it('is made for the real names and addresses, with its key 0600, and reused', async () => {
    const dir = tempDir();
    const { log, seen } = lines();
    const first = await keptCertificate({ dir, log });
    expect(first.made).toBe('there was none');
    expect(seen[0]).toMatch(/made a self-signed certificate .* because there was none/);
    // Checked against the machine itself, not against machineNames().
    const x = new X509Certificate(first.cert);
    for (const name of ['localhost', hostname()]) expect(x.checkHost(name)).toBe(name);
    for (const ip of ['127.0.0.1', '::1']) expect(x.checkIP(ip)).toBe(ip);
    for (const a of Object.values(networkInterfaces()).flatMap((l) => l ?? [])) {
      if (!a.address.toLowerCase().startsWith('fe80:')) expect(x.checkIP(a.address), a.address).toBe(a.address);
    }
    expect(x.ca).toBe(false);
    expect(statSync(first.keyFile).mode & 0o777).toBe(0o600);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(readFileSync(first.certFile, 'utf8')).toBe(first.cert);

    const again = await keptCertificate({ dir, log });
    expect(again.made).toBeUndefined();
    expect(again.cert).toBe(first.cert);
    expect(seen).toHaveLength(1);
  });

  it('is made anew, saying why, when it does not cover a new name or is about to expire; the key stays', async () => {
    const dir = tempDir();
    const { log, seen } = lines();
    const base = machineNames();
    const first = await keptCertificate({ dir, log, names: base });
    const wider = { dns: [...base.dns, 'ddp-host.test'], ips: [...base.ips, '198.51.100.7'] };
    const remade = await keptCertificate({ dir, log, names: wider });
    expect(remade.made).toMatch(/does not cover ddp-host\.test, 198\.51\.100\.7/);
    expect(seen.at(-1)).toContain('does not cover ddp-host.test, 198.51.100.7');
    const x = new X509Certificate(remade.cert);
    expect(x.checkHost('ddp-host.test')).toBe('ddp-host.test');
    expect(x.checkIP('198.51.100.7')).toBe('198.51.100.7');
    expect(remade.cert).not.toBe(first.cert);
    // The same key: Chromium's SPKI pin (trustArgs) of the old certificate still holds.
    expect(remade.key).toBe(first.key);
    expect(spkiSha256(remade.cert)).toBe(spkiSha256(first.cert));

    const later = new Date(Date.now() + 350 * 86_400_000);
    const renewed = await keptCertificate({ dir, log, names: wider, now: later });
    expect(renewed.made).toMatch(/expires on \d{4}-\d\d-\d\d/);
    expect(new Date(new X509Certificate(renewed.cert).validTo).getTime()).toBeGreaterThan(later.getTime() + 300 * 86_400_000);
  });

  it('makes its key 0600 again when it was opened to others, saying so', async () => {
    const dir = tempDir();
    const first = await keptCertificate({ dir });
    chmodSync(first.keyFile, 0o644);
    const { log, seen } = lines();
    await keptCertificate({ dir, log });
    expect(statSync(first.keyFile).mode & 0o777).toBe(0o600);
    expect(seen.join('\n')).toMatch(/was readable by others \(mode 644\): made it 0600/);
  });

  it("the SPKI hash trustArgs gives Chromium is the SHA-256 of the key's public half", async () => {
    const { cert, key } = await testCertificate();
    const spki = createPublicKey(key).export({ type: 'spki', format: 'der' });
    const expected = createHash('sha256').update(spki).digest('base64');
    expect(trustArgs(cert)).toEqual([`--ignore-certificate-errors-spki-list=${expected}`]);
  });

  it('npm start prints its fingerprint and how to trust it', async () => {
    const tls = await testCertificate();
    const text = trustLines(tls).join('\n');
    expect(text).toContain(new X509Certificate(tls.cert).fingerprint256);
    expect(text).toMatch(/self-signed/);
    expect(text).toMatch(/Proceed/);
    expect(text).toContain('certutil -d sql:$HOME/.pki/nssdb -A -t P,, -n browser-ddp -i');
  });
});

describe('bad TLS_CERT and TLS_KEY', () => {
  it('a missing file, a file that is no certificate or key, and a key of another certificate stop the start, naming the file', async () => {
    const dir = tempDir();
    const good = await testCertificate();
    const other = await makeSelfSigned({ dns: ['localhost'], ips: ['127.0.0.1'] });
    const write = (name: string, text: string) => {
      const file = join(dir, name);
      writeFileSync(file, text, { mode: 0o600 });
      return file;
    };
    const cert = write('cert.pem', good.cert);
    const key = write('key.pem', good.key);
    const otherKey = write('other-key.pem', other.key);
    const garbage = write('garbage.pem', 'not a certificate\n');

    const failure = (f: () => unknown): ServerStartError => {
      try {
        f();
      } catch (err) {
        expect(err).toBeInstanceOf(ServerStartError);
        return err as ServerStartError;
      }
      throw new Error('did not fail');
    };
    const missing = failure(() => readTlsFiles(join(dir, 'nope.pem'), key));
    expect(missing.message).toBe(
      `cannot read TLS_CERT=${join(dir, 'nope.pem')}: there is no such file. Give the path of the certificate (PEM)`,
    );
    expect(failure(() => readTlsFiles(garbage, key)).message).toMatch(
      new RegExp(`^the certificate ${garbage} \\(TLS_CERT\\) is not a PEM certificate .*: give the server's certificate in PEM form`),
    );
    expect(failure(() => readTlsFiles(cert, garbage)).message).toMatch(
      new RegExp(`^the key ${garbage} \\(TLS_KEY\\) is not a PEM private key`),
    );
    const mismatch = failure(() => readTlsFiles(cert, otherKey));
    expect(mismatch.code).toBe('ERR_TLS_KEY_MISMATCH');
    expect(mismatch.message).toMatch(
      new RegExp(`^the key ${otherKey} \\(TLS_KEY\\) is not the private key of the certificate ${cert} \\(TLS_CERT\\)`),
    );
    expect(readTlsFiles(cert, key).cert).toBe(good.cert);

    await expect(tlsFromEnv(false, { TLS_CERT: cert })).rejects.toThrow(
      errorOf(ServerStartError, 'TLS_CERT and TLS_KEY go together, and TLS_KEY is not set', { code: 'ERR_TLS_ENV' }),
    );
    await expect(tlsFromEnv(false, { HTTPS: 'maybe' })).rejects.toThrow(
      errorOf(ServerStartError, 'HTTPS=maybe is not understood', { code: 'ERR_TLS_ENV' }),
    );
    expect(await tlsFromEnv(false, {})).toBeUndefined();
    // startServer checks what it is given too, before listening.
    await expect(startServer({ port: 0, log: () => {}, tls: { cert: good.cert, key: other.key } })).rejects.toThrow(
      errorOf(ServerStartError, /is not the private key of the TLS certificate/, { code: 'ERR_TLS_KEY_MISMATCH' }),
    );
  });

  it('npm start says it in one line, without a stack, and exits 1', () => {
    const run = spawnSync(process.execPath, ['--import', 'tsx', join(PROJECT_ROOT, 'signaling/main.ts')], {
      env: { ...process.env, TLS_CERT: '/nonexistent/cert.pem', TLS_KEY: '/nonexistent/key.pem', PORT: '0' },
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect(run.status).toBe(1);
    expect(run.stderr.trim()).toBe(
      'cannot read TLS_CERT=/nonexistent/cert.pem: there is no such file. Give the path of the certificate (PEM)',
    );
    expect(run.stdout).toBe('');
  });
});

describe('the server over https and wss', () => {
  it('a StoreClient connects over wss with the certificate as its CA, and is refused without it', async () => {
    const tls = await testCertificate();
    const server = await withServer({ tls });
    servers.push(server);
    expect(server.url).toBe(`https://127.0.0.1:${server.port}/`);
    expect(server.secure).toBe(true);
    expect(server.certificate?.fingerprint256).toBe(new X509Certificate(tls.cert).fingerprint256);

    const session = uniqueSession('tls');
    const a = await connect(server, session);
    const b = await StoreClient.connect(server.url, { session, token: tokenFor(session), ca: tls.cert });
    await a.set('k', 'over wss');
    expect(new TextDecoder().decode(await b.get('k'))).toBe('over wss');
    a.close();
    b.close();

    const refused = (await StoreClient.connect(server.url, { session, token: tokenFor(session), connectTimeoutMs: 5_000 }).catch(
      (e: unknown) => e,
    )) as ConnectionClosedError;
    expect(refused).toBeInstanceOf(ConnectionClosedError);
    expect(refused.message).toMatch(/self-signed certificate\. Trust the server's certificate: pass it as `ca`/);
    // Another self-signed certificate is no better.
    const other = await makeSelfSigned({ dns: ['localhost'], ips: ['127.0.0.1'] });
    await expect(StoreClient.connect(server.url, { session, token: tokenFor(session), ca: other.cert })).rejects.toThrow(
      ConnectionClosedError,
    );
  });

  it('GET /api/info says secure and lists https URLs; the origin check takes its https origin only', async () => {
    const tls = await testCertificate();
    // A page of its own: the built one (dist/) may not exist yet when vitest runs.
    const staticDir = tempDir();
    writeFileSync(join(staticDir, 'index.html'), '<!doctype html><title>page</title>');
    const server = await withServer({ tls, host: '0.0.0.0', staticDir });
    servers.push(server);
    const info = JSON.parse((await get(`https://127.0.0.1:${server.port}/api/info`, tls.cert)).body) as {
      urls: string[];
      secure: boolean;
      certificate: unknown;
    };
    expect(info.secure).toBe(true);
    expect(info.certificate).toEqual({ fingerprint256: new X509Certificate(tls.cert).fingerprint256, selfSigned: true });
    expect(info.urls.length).toBeGreaterThan(0);
    for (const u of info.urls) expect(u).toMatch(/^https:\/\//);
    // The page itself.
    expect((await get(server.url, tls.cert)).status).toBe(200);

    const own = `https://localhost:${server.port}`;
    expect(await upgrade(server.url, tls.cert, { origin: own, host: `localhost:${server.port}` })).toBe(101);
    expect(await upgrade(server.url, tls.cert, { origin: `http://localhost:${server.port}`, host: `localhost:${server.port}` })).toBe(403);
    expect(await upgrade(server.url, tls.cert, { origin: 'https://evil.example' })).toBe(403);
    expect((await get(`${own}/api/info`, tls.cert, { origin: 'https://evil.example' })).status).toBe(403);
  });
});
