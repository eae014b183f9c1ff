/**
 * The PeerLink compliance suite (test/fixtures/peer_link_suite.ts) on the in-memory link. The
 * same checks run on the WebRTC link inside Chromium in test/e2e/peer_link.spec.ts.
 */
import { describe, expect, it } from 'vitest';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { connectedPair, peerLinkChecks } from './fixtures/peer_link_suite.ts';

// The two ends of each pair find each other by its channel name, unique per pair.
const network = new MemoryNetwork();
const memoryPair = connectedPair((rank) => network.factoryFor(rank));

describe('PeerLink: MemoryLink', () => {
  // The credit window's checks are the WebRTC link's (the memory link has none: only its high-water mark).
  const checks = peerLinkChecks(memoryPair, { creditWindow: false });
  it("runs every check but the credit window's", () => {
    expect(checks.filter((c) => c.skip).map((c) => c.id)).toEqual(['window-awaited', 'window-at-once', 'window-at-once-max']);
  });
  for (const check of checks.filter((c) => !c.skip)) it(check.name, () => check.run(), 30_000);
});
