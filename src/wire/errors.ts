/**
 * Typed errors. Each has a stable `name` to match on and carries the facts a user needs to act:
 * which key, which rank, how long was waited.
 */
import type { ErrorCode } from './protocol.ts';

/** The server refused a request; `code` is one of the protocol's `ErrorCode`s. */
export class StoreError extends Error {
  override name = 'StoreError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/** A blocking store call (get, wait, multiGet) waited its whole timeout. */
export class StoreTimeoutError extends StoreError {
  override name = 'StoreTimeoutError';
  constructor(
    message: string,
    readonly keys: string[],
    readonly timeoutMs: number,
  ) {
    super('TIMEOUT', message, { keys, timeoutMs });
  }
}

/** Rendezvous refused this rank (world size mismatch, rank out of range, duplicate, full). */
export class RendezvousError extends StoreError {
  override name = 'RendezvousError';
}

/**
 * The session's run has ended: a rank closed its rendezvous (torch's RendezvousClosedError, which
 * "signals completion to nodes that arrive late"). A member arriving afterwards is refused
 * (RENDEZVOUS_CLOSED), and one that was waiting without a rank is told. Not recoverable: there
 * is no group left to join; start a new session to train again.
 */
export class RendezvousClosedError extends RendezvousError {
  override name = 'RendezvousClosedError';
  constructor(
    message: string,
    readonly session: string,
    /** The last round, and the rank of it that closed the rendezvous. */
    readonly round: number,
    readonly closedBy: number,
    /** This member's rank in that round, if it had one: its round failed as the others finished the run. */
    readonly rank: number | null = null,
  ) {
    super('RENDEZVOUS_CLOSED', message, { session, round, by: closedBy });
  }
}

/** The server refused the session's token (missing, malformed or not the session's). Not recoverable by retrying. */
export class UnauthorizedError extends StoreError {
  override name = 'UnauthorizedError';
  constructor(
    message: string,
    readonly session: string,
  ) {
    super('UNAUTHORIZED', message, { session });
  }
}

/**
 * The token was the session's, and its host has replaced it since (it removed a tab): the link
 * holding it no longer opens the session. Ask the host for the new link. Not recoverable by retrying.
 */
export class TokenRotatedError extends UnauthorizedError {
  override name = 'TokenRotatedError';
}

/**
 * The session's host removed this tab (`control` 'remove'; its socket was closed with 4011) and
 * changed the session's link, so it cannot come back with the one it had. Not recoverable: the
 * replica it holds can still be saved.
 */
export class RemovedByHostError extends Error {
  override name = 'RemovedByHostError';
  constructor(
    message: string,
    readonly session: string,
  ) {
    super(message);
  }
}

/** A `control` (stop, end, minimum, remove) from a connection that did not present the session's host secret. */
export class NotHostError extends StoreError {
  override name = 'NotHostError';
  constructor(message: string, details: Record<string, unknown> = {}) {
    super('NOT_HOST', message, details);
  }
}

/**
 * The session's host ended it: the server refuses it from then on (SESSION_ENDED) and closed its
 * sockets (close code 4008). Not recoverable: create a new session.
 */
export class SessionEndedError extends StoreError {
  override name = 'SessionEndedError';
  constructor(
    message: string,
    readonly session: string,
  ) {
    super('SESSION_ENDED', message, { session });
  }
}

/** The connection to the server closed while something was waiting on it. */
export class ConnectionClosedError extends Error {
  override name = 'ConnectionClosedError';
  constructor(
    message: string,
    readonly closeCode?: number,
    readonly reason?: string,
  ) {
    super(message);
  }
}

/** A wait that is not a store call (rendezvous, a peer link, a collective) ran out of time. */
export class DistTimeoutError extends Error {
  override name = 'DistTimeoutError';
  constructor(
    /** What was being waited for, in words. */
    readonly waitingFor: string,
    readonly timeoutMs: number,
  ) {
    super(`timed out after ${timeoutMs} ms waiting for ${waitingFor}`);
  }
}

/** A peer closed or stopped answering during a collective. */
export class PeerLostError extends Error {
  override name = 'PeerLostError';
  constructor(
    readonly rank: number,
    readonly reason: string,
  ) {
    super(`lost rank ${rank}: ${reason}`);
  }
}

/**
 * This rank's own page stopped running for longer than the stall bound (`stallTimeoutMs`): the
 * browser froze the tab, the computer slept, a debugger paused it, or a script blocked the page.
 * Its peers have counted it as lost by then, so its group fails at once when it runs again,
 * instead of with the confusing errors that follow (links closed by the peers, the server's
 * eviction). Recoverable: an elastic run rejoins; a fixed group must be made again.
 */
export class RankStalledError extends Error {
  override name = 'RankStalledError';
  constructor(
    /** This rank (in the group that failed). */
    readonly rank: number,
    /** How long the page did not run, in ms (the gap between two of its ticks). */
    readonly stalledMs: number,
    /** What the rank was doing: "waiting for allReduce(sum) of 10 elements #42", or "between collectives". */
    readonly during: string,
    /** The failure that came first after the page ran again, if any (a closed link, the server's eviction). */
    readonly after?: Error,
  ) {
    super(
      `this tab (rank ${rank}) was paused for ${formatSeconds(stalledMs)} (the browser froze it, the computer slept, or a script blocked the page) ` +
        `while it was ${during}: the other ranks have gone on without it`,
    );
  }
}

function formatSeconds(ms: number): string {
  return ms < 10_000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 1000)} s`;
}

/**
 * A role place (a parameter server's, say) is held on the server by another member than the one
 * the ranks agreed on as a round started: a member took it meanwhile. The round is formed again.
 */
export class RoleConflictError extends Error {
  override name = 'RoleConflictError';
  constructor(
    message: string,
    /** The place's key (`claim`). */
    readonly place: string,
    /** The member that holds it on the server (-1: nobody). */
    readonly holder: number,
    /** The member the ranks agreed should hold it (-1: nobody). */
    readonly expected: number,
  ) {
    super(message);
  }
}

/**
 * A rank's contribution to a robust aggregation, as this rank received it, is not the one that
 * rank published (its digest, through the server): it sent different values to different ranks,
 * which would leave the replicas different. The step fails here, naming the rank; the host can
 * remove that tab.
 */
export class ContributionMismatchError extends Error {
  override name = 'ContributionMismatchError';
  constructor(
    message: string,
    readonly rank: number,
    readonly step: number,
  ) {
    super(message);
  }
}

/** Ranks issued different collectives (op, length, root) at the same sequence number. */
export class CollectiveMismatchError extends Error {
  override name = 'CollectiveMismatchError';
  constructor(
    message: string,
    readonly seq: number,
  ) {
    super(message);
  }
}

/**
 * A tensor frame broke the framing rules (duplicate, out of order, truncated or misaligned chunk,
 * a sequence number too far ahead, more buffered than allowed).
 */
export class FramingError extends Error {
  override name = 'FramingError';
  constructor(
    message: string,
    /** The rank the frame came from, once known (the link's, never the frame's own say). */
    readonly rank?: number,
    /** The header field at fault (offset, length, seq, step, ...), when one is. */
    readonly field?: string,
  ) {
    super(message);
  }
}

/**
 * The server sent a frame this client will not act on (not a message, a field of the wrong type
 * or out of range, an unknown type): a server of another version, or something posing as one.
 */
export class ServerMessageError extends Error {
  override name = 'ServerMessageError';
  constructor(
    message: string,
    /** The message's type, when it had one. */
    readonly messageType?: string,
  ) {
    super(message);
  }
}

/**
 * The group was closed from this side: destroyed, or replaced because the server formed a new
 * round (a member left or arrived). Collectives of a closed group reject with it.
 */
export class GroupClosedError extends Error {
  override name = 'GroupClosedError';
}

/**
 * Another rank aborted a collective this rank took part in, for a reason other than a lost peer,
 * a mismatch or bad framing (those arrive as their own errors): its group closed, its link timed
 * out, or something failed there.
 */
export class CollectiveAbortedError extends Error {
  override name = 'CollectiveAbortedError';
  constructor(
    /** The rank that aborted first. */
    readonly origin: number,
    readonly seq: number,
    readonly reason: string,
    /** Whether the origin's failure is one a new round recovers from (a closed group, a timeout). */
    readonly recoverable: boolean,
  ) {
    super(`rank ${origin} aborted collective #${seq}: ${reason}`);
  }
}

/**
 * The gradients averaged across ranks hold a NaN or an infinity (DDP's `errorIfNonfinite`, torch's
 * `error_if_nonfinite`). Every rank sees the same averages, so every rank fails the same step.
 */
export class NonFiniteGradientError extends Error {
  override name = 'NonFiniteGradientError';
  constructor(
    readonly rank: number,
    /** The first parameter (in model order) whose averaged gradient is not finite. */
    readonly parameter: string,
    /** Its index in `model.trainableWeights`. */
    readonly index: number,
  ) {
    super(
      `rank ${rank}: the averaged gradient of parameter ${index} (${parameter}) is not finite (NaN or infinity); the update was not applied`,
    );
  }
}

/**
 * Weights about to be set hold a NaN or an infinity (an averaging, pulled values, a loaded
 * checkpoint or recovery state): refused, and the model keeps the weights it had.
 */
export class NonFiniteWeightsError extends Error {
  override name = 'NonFiniteWeightsError';
  constructor(
    /** The first parameter (in model order) with a value that is not finite. */
    readonly parameter: string,
    /** Its index in the weights set (trainable weights, or all weights for a loaded model). */
    readonly index: number,
    /** Where the weights came from ("the model averaging", "a checkpoint", ...). */
    readonly source: string,
  ) {
    super(`${source}: parameter ${index} (${parameter}) holds a NaN or an infinity; the weights were not set`);
  }
}

/** The replicas' weights differ: the ranks named hold weights unlike the majority's (or rank 0's). */
export class ReplicaDivergenceError extends Error {
  override name = 'ReplicaDivergenceError';
  constructor(
    /** The ranks whose weights differ from the reference. */
    readonly ranks: number[],
    /** Every rank's weights hash, in rank order. */
    readonly hashes: string[],
    /** The hash taken as right: the majority's, or rank 0's when no hash has a majority. */
    readonly reference: string,
    readonly byMajority: boolean,
  ) {
    const who = ranks.length === 1 ? `rank ${ranks[0]}` : `ranks ${ranks.join(', ')}`;
    super(
      `replicas diverged: ${who} ${ranks.length === 1 ? 'has' : 'have'} weights hash ${ranks.map((r) => hashes[r]).join(', ')}, ` +
        `${byMajority ? 'the majority has' : 'rank 0 has (no majority)'} ${reference}`,
    );
  }
}

/**
 * The state a rank sent at recovery does not fit this rank's model (a size, shape or length the
 * receiver did not expect): refused before anything is allocated or loaded.
 */
export class StateTransferError extends Error {
  override name = 'StateTransferError';
  constructor(
    /** The rank that sent the state. */
    readonly rank: number,
    /** What does not fit: a parameter's name, or "header", "model", "optimizer". */
    readonly parameter: string,
    message: string,
  ) {
    super(`state from rank ${rank} refused: ${parameter}: ${message}`);
  }
}

/**
 * A device of a DataParallel (a dedicated Worker with its own TF.js backend) failed: it could not
 * start its backend or build its replica, a step threw on it, it crashed, or it did not answer
 * in time. The DataParallel is unusable afterwards (torch's DataParallel fails the forward
 * likewise); make a new one.
 */
export class DataParallelDeviceError extends Error {
  override name = 'DataParallelDeviceError';
  constructor(
    /** The device's index (0 .. devices - 1). */
    readonly device: number,
    /** The backend it ran, or null when it never started one. */
    readonly backend: string | null,
    /** What it was doing: "start" or "step N". */
    readonly during: string,
    /** Why, in the device's own words where it gave any. */
    readonly reason: string,
  ) {
    super(`DataParallel device ${device} (a Worker${backend ? ` on ${backend}` : ''}) failed during ${during}: ${reason}`);
  }
}

/** Why a WebGPU device was lost, as GPUDeviceLostInfo says: 'destroyed' by the page itself, or 'unknown' (a reset, a crash). */
export type DeviceLostReason = 'destroyed' | 'unknown';

/**
 * This tab's WebGPU device was lost (GPUDevice.lost): the driver reset or crashed, the laptop
 * switched graphics cards, the GPU ran out of memory, or the page destroyed the device. Every
 * tensor on it is gone, so this rank's replica is gone too. The tab can rejoin with a new device:
 * reload it, or give runElastic a `rebuildState`, which re-creates the backend and rejoins by
 * itself.
 */
export class DeviceLostError extends Error {
  override name = 'DeviceLostError';
  constructor(
    /** The rank whose device was lost, or -1 when not known (not in a group yet). */
    readonly rank: number,
    readonly reason: DeviceLostReason,
    /** The browser's own words (GPUDeviceLostInfo.message). */
    readonly detail: string,
    /** What the rank was doing when it was lost, e.g. "step 12". */
    readonly during: string,
    /** What this error adds to the usual advice (e.g. why the backend could not come back). */
    advice = 'Reload the page to rejoin the session with a new device (runElastic rejoins by itself when given rebuildState).',
    options?: { cause?: unknown },
  ) {
    const who = rank >= 0 ? `rank ${rank}'s` : "this tab's";
    const why =
      reason === 'destroyed'
        ? 'the page destroyed it (GPUDevice.destroy())'
        : 'the GPU was reset or taken away (a driver crash or update, the computer switching graphics cards, or too little GPU memory)';
    super(
      `${who} WebGPU device was lost during ${during}: ${why}; the browser said "${detail}". Every tensor on that device is gone. ${advice}`,
      options,
    );
  }
}

/**
 * Whether a new round of the group can recover from `err`: a lost rank or server, this rank
 * paused past the stall bound (it rejoins), a group replaced by a new round, a wait that ran out
 * because a peer went away. A mismatch between ranks, bad frames or a bug in the training step
 * are not: every round would fail the same way.
 * Neither is a lost WebGPU device (DeviceLostError) by itself: runElastic recovers from it only
 * when it can rebuild the state (`rebuildState`).
 */
export function isRecoverable(err: unknown): boolean {
  return (
    err instanceof RoleConflictError ||
    err instanceof PeerLostError ||
    err instanceof RankStalledError ||
    err instanceof ConnectionClosedError ||
    err instanceof GroupClosedError ||
    err instanceof DistTimeoutError ||
    err instanceof StoreTimeoutError ||
    (err instanceof CollectiveAbortedError && err.recoverable)
  );
}
