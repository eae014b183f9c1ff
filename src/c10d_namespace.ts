/**
 * `c10d`: the collectives' internals a benchmark or a tool may want: the reduce functions, the
 * algorithm choice, the bytes a collective sends, and the peer links under a process group.
 */
export { reducer } from './c10d/ring.ts';
export { chooseAlgorithm, DEFAULT_LATENCY_THRESHOLD_BYTES, type CollectiveAlgorithm } from './c10d/latency_collectives.ts';
export { allReduceBytes, meshAllGatherBytes, messageBytes, type CollectiveBytesOptions } from './c10d/collective_bytes.ts';
export { storeSocketUrl } from './c10d/store.ts';
export type { LinkDetails, LinkPath, LinkStats } from './c10d/process_group.ts';
export type { PeerLink, PeerLinkFactory, LinkState, CandidateType, PathSample } from './transport/peer_link.ts';
export { selectedPath } from './transport/link_stats.ts';
