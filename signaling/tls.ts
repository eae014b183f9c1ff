/**
 * HTTPS for the server: browsers offer WebGPU only to secure pages, so a tab on another machine
 * needs https (localhost is secure already). Either the host's own certificate (TLS_CERT and
 * TLS_KEY, PEM files) or a self-signed one made here for this machine's names and addresses,
 * kept in certs/ (key mode 0600) so that a browser that trusted it once keeps trusting it, and
 * made anew when it no longer covers the machine or is about to expire.
 */
import { X509Certificate, createHash, createPrivateKey, createPublicKey, randomBytes, type KeyObject } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { hostname, networkInterfaces, type NetworkInterfaceInfo } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { ServerStartError, isLinkLocal6 } from './network.ts';
import { PROJECT_ROOT } from './package_root.ts';

/** A certificate and its private key, as `startServer({ tls })` takes them. */
export interface TlsOptions {
  /** The certificate (PEM), followed by its chain if any: the server's own certificate first. */
  cert: string | Buffer;
  /** The certificate's private key (PEM, unencrypted). */
  key: string | Buffer;
  /** The files they were read from, named in errors. */
  certFile?: string;
  keyFile?: string;
}

/** What a person needs to know about the certificate served. */
export interface CertificateFacts {
  /** SHA-256 of the certificate, "AB:CD:..." as browsers show it. */
  fingerprint256: string;
  /** Base64 SHA-256 of its SubjectPublicKeyInfo (what Chromium's --ignore-certificate-errors-spki-list takes). */
  spkiSha256: string;
  /** Issuer and subject are the same: browsers warn until it is trusted. */
  selfSigned: boolean;
  validTo: Date;
  /** subjectAltName DNS names and IP addresses. */
  dnsNames: string[];
  ipAddresses: string[];
}

/** The names and addresses a certificate for this machine must cover. */
export interface MachineNames {
  dns: string[];
  ips: string[];
}

/** Where `npm start -- --https` and `npm run launch -- --https` keep their certificate: CERT_DIR, or certs/ in the project. */
export function defaultCertDir(): string {
  return resolve(process.env.CERT_DIR ?? join(PROJECT_ROOT, 'certs'));
}

/** A path as a person would type it here: relative to the working directory when inside it. */
function shownPath(file: string): string {
  const rel = relative(process.cwd(), file);
  return rel && !rel.startsWith('..') ? rel : file;
}

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/;

/** The first certificate of a PEM chain. */
function leaf(cert: string | Buffer): X509Certificate {
  const match = PEM_CERT.exec(cert.toString());
  if (!match) throw new Error('no "-----BEGIN CERTIFICATE-----" block in it');
  return new X509Certificate(match[0]);
}

/** Base64 SHA-256 of the certificate's SubjectPublicKeyInfo (RFC 7469's pin). */
export function spkiSha256(cert: string | Buffer): string {
  const spki = leaf(cert).publicKey.export({ type: 'spki', format: 'der' });
  return createHash('sha256').update(spki).digest('base64');
}

export function certificateFacts(cert: string | Buffer): CertificateFacts {
  const x = leaf(cert);
  const san = parseSubjectAltName(x.subjectAltName ?? '');
  return {
    fingerprint256: x.fingerprint256,
    spkiSha256: spkiSha256(cert),
    selfSigned: x.issuer === x.subject && x.verify(x.publicKey),
    validTo: new Date(x.validTo),
    dnsNames: san.dns,
    ipAddresses: san.ips,
  };
}

/** "DNS:localhost, IP Address:127.0.0.1, ..." -> names and addresses. */
function parseSubjectAltName(san: string): MachineNames {
  const dns: string[] = [];
  const ips: string[] = [];
  for (const part of san.split(/,\s*/)) {
    const m = /^(DNS|IP Address):(.*)$/.exec(part.trim());
    if (m?.[1] === 'DNS') dns.push(m[2]!);
    else if (m?.[1] === 'IP Address') ips.push(m[2]!.toLowerCase());
  }
  return { dns, ips };
}

/**
 * What a certificate for this machine must name: localhost, the host name (and its mDNS
 * `.local` form), 127.0.0.1, ::1 and every address of every interface except IPv6 link-local
 * ones (a browser cannot open those, and they come and go with virtual interfaces).
 */
export function machineNames(
  interfaces: NodeJS.Dict<NetworkInterfaceInfo[]> = networkInterfaces(),
  host: string = hostname(),
): MachineNames {
  const name = host.toLowerCase();
  const dns = ['localhost', name, ...(name.includes('.') ? [] : [`${name}.local`])];
  const addresses = Object.values(interfaces)
    .flatMap((list) => list ?? [])
    .map((a) => a.address.toLowerCase())
    .filter((a) => !isLinkLocal6(a));
  return { dns: [...new Set(dns)], ips: [...new Set(['127.0.0.1', '::1', ...addresses])] };
}

/**
 * `machineNames()` and the names the server is told to answer to (ALLOWED_HOSTS, comma-separated):
 * a DNS name other machines use must be in the certificate too, or browsers refuse it.
 */
export function certificateNames(env: NodeJS.ProcessEnv = process.env): MachineNames {
  const names = machineNames();
  for (const raw of (env.ALLOWED_HOSTS ?? '').split(',')) {
    const h = raw
      .trim()
      .toLowerCase()
      .replace(/^\[(.*)\]$/, '$1');
    if (!h) continue;
    const list = isIP(h) ? names.ips : names.dns;
    if (!list.includes(h)) list.push(h);
  }
  return names;
}

/** The names and addresses of `want` that `cert` does not cover. */
export function uncovered(cert: string | Buffer, want: MachineNames): string[] {
  const x = leaf(cert);
  return [...want.dns.filter((n) => x.checkHost(n) === undefined), ...want.ips.filter((ip) => x.checkIP(ip) === undefined)];
}

/**
 * Checks a certificate and key before the server uses them, so that a bad file stops the start
 * with a message naming it (rather than a TLS handshake failing later in a browser).
 */
export function checkTls(tls: TlsOptions, now: Date = new Date()): { cert: X509Certificate; key: KeyObject } {
  const certName = tls.certFile ? `the certificate ${tls.certFile} (TLS_CERT)` : 'the TLS certificate';
  const keyName = tls.keyFile ? `the key ${tls.keyFile} (TLS_KEY)` : 'the TLS key';
  let cert: X509Certificate;
  try {
    cert = leaf(tls.cert);
  } catch (err) {
    throw new ServerStartError(
      `${certName} is not a PEM certificate (${(err as Error).message}): give the server's certificate in PEM form ("-----BEGIN CERTIFICATE-----"), or drop TLS_CERT and TLS_KEY to use a self-signed one`,
      'ERR_TLS_CERT',
    );
  }
  let key: KeyObject;
  try {
    key = createPrivateKey(tls.key);
  } catch (err) {
    const encrypted = /ENCRYPTED/.test(tls.key.toString());
    throw new ServerStartError(
      `${keyName} is not ${encrypted ? 'an unencrypted' : 'a'} PEM private key (${(err as Error).message.replace(/^error:\S+:/, '')}): give the certificate's private key in PEM form ("-----BEGIN PRIVATE KEY-----")${encrypted ? ', decrypted (openssl pkey -in KEY -out KEY.plain)' : ''}`,
      'ERR_TLS_KEY',
    );
  }
  if (!cert.checkPrivateKey(key)) {
    throw new ServerStartError(
      `${keyName} is not the private key of ${certName} (subject ${cert.subject.replace(/\n/g, ', ')}): give the key the certificate was issued for`,
      'ERR_TLS_KEY_MISMATCH',
    );
  }
  if (new Date(cert.validTo) <= now) {
    throw new ServerStartError(
      `${certName} expired on ${cert.validTo}: renew it, or drop TLS_CERT and TLS_KEY to use a self-signed one`,
      'ERR_TLS_CERT_EXPIRED',
    );
  }
  return { cert, key };
}

/** Reads TLS_CERT and TLS_KEY's files; a missing or unreadable one stops the start naming it. */
export function readTlsFiles(certFile: string, keyFile: string): TlsOptions {
  const read = (file: string, what: 'TLS_CERT' | 'TLS_KEY'): string => {
    try {
      return readFileSync(file, 'utf8');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      const why =
        code === 'ENOENT'
          ? 'there is no such file'
          : code === 'EACCES'
            ? 'this user may not read it'
            : code === 'EISDIR'
              ? 'it is a directory'
              : (err as Error).message;
      throw new ServerStartError(
        `cannot read ${what}=${file}: ${why}. Give the path of the ${what === 'TLS_CERT' ? 'certificate' : 'private key'} (PEM)`,
        `ERR_${what}`,
      );
    }
  };
  const tls = { cert: read(certFile, 'TLS_CERT'), key: read(keyFile, 'TLS_KEY'), certFile, keyFile };
  checkTls(tls);
  return tls;
}

export interface KeptCertificateOptions {
  /** Where it is kept (cert.pem, key.pem). Default: `defaultCertDir()`. */
  dir?: string;
  /** What it must cover. Default: `certificateNames()` (this machine and ALLOWED_HOSTS). */
  names?: MachineNames;
  /** Made anew when it expires sooner than this. Default 30 days. */
  renewWithinDays?: number;
  /** How long a new one is valid. Default 365 days. */
  validDays?: number;
  /** Says when it is made and why. */
  log?: (line: string) => void;
  now?: Date;
}

export interface KeptCertificate extends TlsOptions {
  cert: string;
  key: string;
  certFile: string;
  keyFile: string;
  /** Why it was made now, or undefined when the kept one was reused. */
  made?: string;
}

/**
 * The self-signed certificate kept in `dir`, made (or made anew) when there is none, it does not
 * cover `names`, or it expires within `renewWithinDays`. A remade certificate keeps the kept key,
 * so a pin of its public key (Chromium's --ignore-certificate-errors-spki-list) stays valid;
 * browsers that trusted the certificate itself must trust the new one.
 */
export async function keptCertificate(options: KeptCertificateOptions = {}): Promise<KeptCertificate> {
  const dir = options.dir ?? defaultCertDir();
  const names = options.names ?? certificateNames();
  const now = options.now ?? new Date();
  const renewMs = (options.renewWithinDays ?? 30) * 86_400_000;
  const certFile = join(dir, 'cert.pem');
  const keyFile = join(dir, 'key.pem');
  const shown = shownPath(certFile);
  let reason = 'there was none';
  let reusableKey: string | undefined;
  if (existsSync(certFile) && existsSync(keyFile)) {
    try {
      const cert = readFileSync(certFile, 'utf8');
      const key = readFileSync(keyFile, 'utf8');
      const x = leaf(cert);
      const keyObject = createPrivateKey(key);
      if (!x.checkPrivateKey(keyObject)) throw new Error('its key is not the one in key.pem');
      reusableKey = key;
      restrictKey(keyFile, options.log);
      const missing = uncovered(cert, names);
      const expires = new Date(x.validTo);
      if (missing.length > 0) reason = `the kept one (${shown}) does not cover ${missing.join(', ')}`;
      else if (expires.getTime() - now.getTime() < renewMs)
        reason = `the kept one (${shown}) expires on ${expires.toISOString().slice(0, 10)}`;
      else if (new Date(x.validFrom) > now)
        reason = `the kept one (${shown}) is not valid yet (valid from ${x.validFrom}): is the clock right?`;
      else return { cert, key, certFile, keyFile };
    } catch (err) {
      reason = `the kept one (${shown}) could not be used: ${(err as Error).message}`;
    }
  }
  const made = await makeSelfSigned(names, { now, validDays: options.validDays ?? 365, key: reusableKey });
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  // Written aside and renamed: a reader never sees half a file; the key is 0600 from its first byte.
  // Unpredictable and created exclusively: nobody can place a file or a link there first to read the key.
  const tmp = `.${process.pid}-${randomBytes(9).toString('hex')}`;
  writeFileSync(keyFile + tmp, made.key, { mode: 0o600, flag: 'wx' });
  writeFileSync(certFile + tmp, made.cert, { mode: 0o644, flag: 'wx' });
  renameSync(keyFile + tmp, keyFile);
  renameSync(certFile + tmp, certFile);
  options.log?.(`[tls] made a self-signed certificate (${shown}) because ${reason}; it covers ${[...names.dns, ...names.ips].join(', ')}`);
  return { ...made, certFile, keyFile, made: reason };
}

/** A key readable by others is no secret: kept keys are 0600. */
function restrictKey(keyFile: string, log?: (line: string) => void): void {
  const mode = statSync(keyFile).mode & 0o777;
  if ((mode & 0o077) === 0) return;
  chmodSync(keyFile, 0o600);
  log?.(`[tls] ${keyFile} was readable by others (mode ${mode.toString(8)}): made it 0600`);
}

/** A new self-signed server certificate (ECDSA P-256, SHA-256) for `names`. */
export async function makeSelfSigned(
  names: MachineNames,
  options: { now?: Date; validDays?: number; key?: string } = {},
): Promise<{ cert: string; key: string }> {
  const { generate } = await import('selfsigned');
  const now = options.now ?? new Date();
  // A day back: a machine whose clock is a little behind would see a certificate "not yet valid".
  const notBeforeDate = new Date(now.getTime() - 86_400_000);
  const notAfterDate = new Date(now.getTime() + (options.validDays ?? 365) * 86_400_000);
  const keyPair = options.key
    ? { privateKey: options.key, publicKey: createPublicKey(options.key).export({ type: 'spki', format: 'pem' }).toString() }
    : undefined;
  const pems = await generate(
    [
      { name: 'commonName', value: names.dns.find((n) => n !== 'localhost') ?? 'localhost' },
      { name: 'organizationName', value: 'browser-ddp (self-signed)' },
    ],
    {
      keyType: 'ec',
      curve: 'P-256',
      algorithm: 'sha256',
      notBeforeDate,
      notAfterDate,
      ...(keyPair ? { keyPair } : {}),
      extensions: [
        // A server certificate, not a CA: Firefox refuses a CA certificate used as a server's.
        { name: 'basicConstraints', cA: false, critical: true },
        { name: 'keyUsage', digitalSignature: true, critical: true },
        { name: 'extKeyUsage', serverAuth: true },
        {
          name: 'subjectAltName',
          altNames: [...names.dns.map((value) => ({ type: 2 as const, value })), ...names.ips.map((ip) => ({ type: 7 as const, ip }))],
        },
      ],
    },
  );
  return { cert: pems.cert, key: pems.private };
}

/** HTTPS=1 (true, yes) on; unset, empty, 0 (false, no) off; anything else is a mistake. */
function httpsFromEnv(value: string | undefined): boolean {
  const v = (value ?? '').trim().toLowerCase();
  if (['', '0', 'false', 'no', 'off'].includes(v)) return false;
  if (['1', 'true', 'yes', 'on'].includes(v)) return true;
  throw new ServerStartError(
    `HTTPS=${value} is not understood: use HTTPS=1 (or npm start -- --https) to serve https, or leave HTTPS unset`,
    'ERR_TLS_ENV',
  );
}

/**
 * What `npm start` serves over: TLS_CERT and TLS_KEY (PEM files) when given, else with `--https`
 * or HTTPS=1 the self-signed certificate kept in CERT_DIR (certs/), else plain http (undefined).
 * Anything wrong stops the start with a `ServerStartError` naming the file and what to do.
 */
export async function tlsFromEnv(
  https: boolean,
  env: NodeJS.ProcessEnv = process.env,
  log: (line: string) => void = console.log,
): Promise<TlsOptions | undefined> {
  const certFile = env.TLS_CERT || undefined;
  const keyFile = env.TLS_KEY || undefined;
  if (certFile || keyFile) {
    if (!certFile || !keyFile) {
      throw new ServerStartError(
        `TLS_CERT and TLS_KEY go together, and ${certFile ? 'TLS_KEY' : 'TLS_CERT'} is not set: give both (the certificate and its private key, PEM files), or neither for a self-signed certificate (--https)`,
        'ERR_TLS_ENV',
      );
    }
    const tls = readTlsFiles(certFile, keyFile);
    const mode = statSync(keyFile).mode & 0o777;
    if (mode & 0o077)
      log(`Warning: TLS_KEY=${keyFile} can be read by other users of this machine (mode ${mode.toString(8)}): chmod 600 ${keyFile}`);
    return tls;
  }
  if (!https && !httpsFromEnv(env.HTTPS)) return undefined;
  const dir = env.CERT_DIR ? resolve(env.CERT_DIR) : defaultCertDir();
  try {
    return await keptCertificate({ dir, log });
  } catch (err) {
    throw new ServerStartError(
      `cannot keep a self-signed certificate in ${dir}: ${(err as Error).message}. Choose a folder this user may write with CERT_DIR=..., or give a certificate with TLS_CERT and TLS_KEY`,
      'ERR_TLS_CERT',
    );
  }
}

/**
 * What `npm start` prints about its certificate: the fingerprint, and for a self-signed one how
 * a browser on another machine comes to trust it.
 */
export function trustLines(tls: TlsOptions): string[] {
  const facts = certificateFacts(tls.cert);
  const file = tls.certFile ? shownPath(tls.certFile) : undefined;
  if (!facts.selfSigned) {
    return [
      `HTTPS with ${file ?? 'the given certificate'} (valid until ${facts.validTo.toISOString().slice(0, 10)}), SHA-256 fingerprint ${facts.fingerprint256}`,
    ];
  }
  return [
    `HTTPS with a self-signed certificate${file ? ` (${file})` : ''}, valid until ${facts.validTo.toISOString().slice(0, 10)}. Its SHA-256 fingerprint:`,
    `  ${facts.fingerprint256}`,
    'Browsers on other machines warn about it ("Your connection is not private") until they trust it. Either:',
    '  - check and proceed: on the warning page open the certificate (Chrome, Edge: click "Not secure" in the address bar, then the certificate;',
    '    Firefox: Advanced, View Certificate), compare its SHA-256 fingerprint with the one above, and only if it matches proceed',
    '    (Chrome, Edge: Advanced, Proceed; Firefox: Accept the Risk and Continue; Safari: Show Details, visit this website).',
    '    Chromium then treats the page as secure, WebGPU included, until it forgets the exception (it asks again later);',
    `  - or copy ${file ?? 'the certificate'} to it and import it once as trusted for websites (Chrome, Edge on Linux:`,
    `    certutil -d sql:$HOME/.pki/nssdb -A -t P,, -n browser-ddp -i ${file ?? 'cert.pem'}; elsewhere the browser's or system's certificate settings).`,
    "A new certificate is made when this machine's names or addresses change (npm start says so): browsers must trust it again.",
  ];
}
