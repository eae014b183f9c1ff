/**
 * The parameter-server wire format: every request (worker -> server) and reply (server ->
 * worker) is one point-to-point message of HEADER u32 words followed by the shard's floats
 * (gradients in a push, values in a reply). Lengths are fixed per (worker, server) pair, so a
 * receive always knows what comes. Every field read from a peer is checked by its reader.
 */
import type { Lease, PsSampleCounts } from './leases.ts';

export const HEADER = 16;

/** Request kinds (bits): a pull, a push (gradients follow), and the worker's last request of the round. */
export const REQ_PULL = 1;
export const REQ_PUSH = 2;
export const REQ_END = 4;

export const VERDICT = { none: 0, applied: 1, stale: 2, duplicate: 3, refused: 4 } as const;

/** What server 0 tells a worker to do next (the other servers say 'continue' or 'ended'). */
export const CONTROL = { continue: 0, stop: 1, regroup: 2, ended: 3 } as const;
export type Control = (typeof CONTROL)[keyof typeof CONTROL];

export interface RequestHead {
  kind: number;
  stepId: number;
  /** The shard version the gradients were computed at. */
  version: number;
  /** Samples of the push (the worker's count). */
  samples: number;
  /** With REQ_END: what server 0 told the worker (stop or regroup). */
  endControl: number;
}

export interface ReplyHead {
  verdict: number;
  version: number;
  control: number;
  lease: Lease | null;
  staleness: number;
  /** Server 0's counts (zeros from the others). */
  counts: PsSampleCounts;
}

/** A message buffer for a shard of `numel` floats. */
export function message(numel: number): Float32Array {
  return new Float32Array(HEADER + numel);
}

function head(buf: Float32Array): Uint32Array {
  return new Uint32Array(buf.buffer, buf.byteOffset, HEADER);
}

/** The floats after the header (a view). */
export function payload(buf: Float32Array): Float32Array {
  return buf.subarray(HEADER);
}

export function writeRequest(buf: Float32Array, r: RequestHead, grads: Float32Array | null): void {
  const h = head(buf);
  h.fill(0);
  h.set([r.kind, r.stepId, r.version, r.samples, r.endControl]);
  if (grads) buf.set(grads, HEADER);
  else buf.fill(0, HEADER);
}

export function readRequest(buf: Float32Array): RequestHead {
  const h = head(buf);
  return { kind: h[0]!, stepId: h[1]!, version: h[2]!, samples: h[3]!, endControl: h[4]! };
}

export function writeReply(buf: Float32Array, r: ReplyHead, values: Float32Array): void {
  const h = head(buf);
  h.fill(0);
  const l = r.lease;
  h.set([r.verdict, r.version, r.control, l?.epoch ?? 0, l?.position ?? 0, l?.replicas ?? 0, l?.rank ?? 0, l?.count ?? 0, r.staleness]);
  const c = r.counts;
  h.set([c.target, c.leased, c.applied, c.stale, c.refused, c.lost, c.epoch], 9);
  buf.set(values, HEADER);
}

export function readReply(buf: Float32Array): ReplyHead {
  const h = head(buf);
  const control = h[2]!;
  return {
    verdict: h[0]!,
    version: h[1]!,
    control,
    lease: control === CONTROL.continue ? { epoch: h[3]!, position: h[4]!, replicas: h[5]!, rank: h[6]!, count: h[7]! } : null,
    staleness: h[8]!,
    counts: { target: h[9]!, leased: h[10]!, applied: h[11]!, stale: h[12]!, refused: h[13]!, lost: h[14]!, epoch: h[15]! },
  };
}

export const NO_COUNTS: PsSampleCounts = { target: 0, leased: 0, applied: 0, stale: 0, refused: 0, lost: 0, epoch: 0 };
