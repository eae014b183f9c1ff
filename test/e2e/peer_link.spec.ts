/**
 * The PeerLink compliance suite (test/fixtures/peer_link_suite.ts) on the WebRTC link, in
 * Chromium: one page holds both ends of every link, each end's signals handed straight to the
 * other in the page (no server relay, no STUN), so what is under test is the real data channel,
 * simple-peer and the link's credit window. The in-memory link runs the same checks under vitest
 * (test/peer_link_compliance.test.ts).
 */
import { join } from 'node:path';
import type { Plugin } from 'vite';
import { PROJECT_ROOT } from '../../signaling/server.ts';
import type { CheckResult } from '../fixtures/peer_link_suite.ts';
import { expect, test } from './fixtures.ts';

/** Chromium's data-channel message limit (256 KiB, its SCTP max-message-size): the suite's 1 MiB messages are over it. */
const CHROMIUM_MAX_MESSAGE = 256 << 10;

const ENTRY = 'virtual:peer-link-page';

/** The page's module: the suite on pairs of simple-peer links. */
const ENTRY_CODE = `
import { connectedPair, peerLinkChecks, runChecks } from ${JSON.stringify(join(PROJECT_ROOT, 'test/fixtures/peer_link_suite.ts'))};
import { loadSimplePeer, simplePeerLinkFactory } from ${JSON.stringify(join(PROJECT_ROOT, 'src/transport/webrtc_link.ts'))};

export async function run() {
  await loadSimplePeer();
  const checks = peerLinkChecks(connectedPair(() => simplePeerLinkFactory(), []), {
    creditWindow: true,
    maxMessageBytes: ${CHROMIUM_MAX_MESSAGE},
  });
  return runChecks(checks);
}

/**
 * Data before 'connect': simple-peer says 'connect' only once getStats shows the selected path
 * (polled every 100 ms), while the channel already carries data. Here the receiving end's
 * getStats answers 1.5 s late; the sender bursts four credit windows as soon as its own end is
 * open. The receiver's credits must reach it before its own 'connect', or the sender waits out
 * its stall bound (5 s here; a 2-rank run once stalled its whole 120 s so).
 */
export async function earlyData() {
  await loadSimplePeer();
  class LateStats extends RTCPeerConnection {
    getStats(...args) {
      return new Promise((r) => setTimeout(r, 1500)).then(() => super.getStats(...args));
    }
  }
  const late = { RTCPeerConnection: LateStats, RTCSessionDescription, RTCIceCandidate };
  const makePair = connectedPair((rank) => simplePeerLinkFactory(rank === 1 ? late : undefined), []);
  const { a, b } = makePair({ highWaterMark: 4 << 20, stallTimeoutMs: 5000, windowBytes: 128 << 10 });
  let received = 0;
  b.link.onMessage((bytes) => (received += bytes.byteLength));
  let receiverOpen = false;
  b.opened.then(() => (receiverOpen = true));
  await a.opened;
  const frame = new Uint8Array(32 << 10);
  let error = null;
  try {
    for (let i = 0; i < 16; i++) await a.link.send(frame);
  } catch (e) {
    error = String(e);
  }
  const sentBeforeReceiverOpen = !receiverOpen;
  await b.opened;
  for (const deadline = performance.now() + 5000; received < 16 * frame.byteLength && performance.now() < deadline; )
    await new Promise((r) => setTimeout(r, 20));
  a.link.close();
  b.link.close();
  return { sentBeforeReceiverOpen, received, error };
}
`;

/**
 * The suite and the WebRTC link built into one classic script (the server serves only the built
 * app, which does not hold them), simple-peer's lazy import inlined.
 */
async function pageScript(): Promise<string> {
  const entry: Plugin = {
    name: 'peer-link-page',
    resolveId: (id) => (id.endsWith(ENTRY) ? `\0${ENTRY}` : undefined),
    load: (id) => (id === `\0${ENTRY}` ? ENTRY_CODE : undefined),
  };
  const { build } = await import('vite');
  const built = await build({
    root: PROJECT_ROOT,
    configFile: false,
    logLevel: 'warn',
    plugins: [entry],
    build: {
      write: false,
      target: 'es2022',
      minify: false,
      lib: { entry: ENTRY, formats: ['iife'], name: 'peerLinkPage', fileName: 'peer_link_page' },
    },
  });
  const output = (Array.isArray(built) ? built : [built]).flatMap((b) => ('output' in b ? b.output : []));
  const chunk = output.find((o) => o.type === 'chunk');
  if (chunk?.type !== 'chunk') throw new Error('the page script did not build');
  return chunk.code;
}

test('the WebRTC link passes the PeerLink compliance suite', async ({ page, server }) => {
  const script = await pageScript();
  // A blank page at the server's origin (a secure context, as the app's): the app itself is not needed.
  const url = new URL('/peer-link-compliance', server.url).href;
  await page.route(url, (route) => route.fulfill({ contentType: 'text/html', body: '<!doctype html><title>PeerLink compliance</title>' }));
  await page.goto(url);
  await page.addScriptTag({ content: script });
  const results = await page.evaluate(() => (window as unknown as { peerLinkPage: { run(): Promise<CheckResult[]> } }).peerLinkPage.run());
  for (const r of results) console.log(`${r.status.padEnd(7)} ${String(r.ms).padStart(5)} ms  ${r.name}${r.detail ? `: ${r.detail}` : ''}`);

  expect(results.filter((r) => r.status === 'failed').map((r) => `${r.name}: ${r.detail}`)).toEqual([]);
  // Everything ran but the sizes over Chromium's message limit; the credit window's checks among them.
  expect(results.filter((r) => r.status === 'skipped').map((r) => r.id)).toEqual([`size-${1 << 20}`]);
  expect(results.filter((r) => r.id.startsWith('window-') && r.status === 'passed').map((r) => r.id)).toEqual([
    'window-awaited',
    'window-at-once',
    'window-at-once-max',
    'window-off',
  ]);
});

test("data that arrives before the receiving end's 'connect' is credited: the sender is not held to its stall bound", async ({
  page,
  server,
}) => {
  const script = await pageScript();
  const url = new URL('/peer-link-early-data', server.url).href;
  await page.route(url, (route) => route.fulfill({ contentType: 'text/html', body: '<!doctype html><title>Early data</title>' }));
  await page.goto(url);
  await page.addScriptTag({ content: script });
  const r = await page.evaluate(() =>
    (
      window as unknown as {
        peerLinkPage: { earlyData(): Promise<{ sentBeforeReceiverOpen: boolean; received: number; error: string | null }> };
      }
    ).peerLinkPage.earlyData(),
  );
  // The burst of four windows went while the receiver had not said 'connect' yet, and all of it arrived.
  expect(r).toEqual({ sentBeforeReceiverOpen: true, received: 16 * (32 << 10), error: null });
});
