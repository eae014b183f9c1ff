/**
 * What the training page tells a person when a run fails: a title, a next step, and whether
 * rejoining may help, for each way a run can fail. Kept apart from the page (train_page.ts),
 * which only decides when to show it; the wording is the product's, in one place.
 */
import {
  ConnectionClosedError,
  DeviceLostError,
  DistTimeoutError,
  NonFiniteGradientError,
  PeerLostError,
  RankStalledError,
  RendezvousClosedError,
  RendezvousError,
  ReplicaDivergenceError,
  SessionEndedError,
  TokenRotatedError,
  UnauthorizedError,
} from '../../src/index.ts';
import { ConfigError } from '../../src/jobs/train_config.ts';
import { MissingTokenError } from '../page_token.ts';
import { ConfigMismatchError } from '../train/harness.ts';
import { CannotTrainError } from '../train/preflight.ts';

/** A title, a next step a person can act on (if any), and whether rejoining may help. */
export type Advice = [string, string | undefined, boolean];

/**
 * A title, a next step a person can act on, and whether rejoining may help, for each way a run
 * can fail. `fixed`: the session has a fixed number of tabs (the others wait for a lost one).
 */
export function explain(e: Error, fixed: boolean): Advice {
  if (e instanceof CannotTrainError) return [e.title, e.action, false];
  return linkAdvice(e) ?? trainingAdvice(e, fixed);
}

/** The link, the session or its configuration refused this tab: rejoining with the same link cannot help. */
function linkAdvice(e: Error): Advice | undefined {
  if (e instanceof RendezvousClosedError) {
    return [
      'This run has ended',
      "The session's training finished before this tab got a rank. To train, ask the host for a new link, or create a new session on the start page.",
      false,
    ];
  }
  if (e instanceof RendezvousError) {
    switch (e.code) {
      case 'WORLD_SIZE_MISMATCH':
        return ['World size disagrees with the session', 'Open the link exactly as it was shared.', false];
      default:
        return ['Could not join the session', 'Open the link exactly as it was shared, or create a new session on the start page.', false];
    }
  }
  if (e instanceof SessionEndedError)
    return ['The host ended this session', 'Download the model if you want to keep it; to train again, create a new session.', false];
  if (e instanceof TokenRotatedError) {
    return [
      'This link is no longer valid',
      'The host removed a tab from this session and changed its link, so this one no longer opens it. Ask the host for the new link.',
      false,
    ];
  }
  if (e instanceof UnauthorizedError && /does not exist on this server/.test(e.message)) {
    return [
      'No such session on this server',
      'Open the full link the host shared (with its #token=...). Sessions are created by the host, on the start page.',
      false,
    ];
  }
  if (e instanceof UnauthorizedError) {
    return [
      'Wrong link for this session',
      'This session is guarded by the secret in its link (#token=...). Open the full link the host shared; a shortened or retyped link cannot join.',
      false,
    ];
  }
  if (e instanceof MissingTokenError) {
    return [
      'This link has no #token=... at its end',
      "That part is the session's secret, and chat apps and some editors cut links at the #. Open the full link the host shared, or create a new session on the start page.",
      false,
    ];
  }
  if (e instanceof ConfigMismatchError)
    return ['Configuration disagrees with the session', 'Open the link exactly as it was shared, or create a new session.', false];
  if (e instanceof ConfigError)
    return ['This link is not valid', 'Open the link exactly as it was shared, or create a new session on the start page.', false];
  return undefined;
}

/** The run failed as it trained: a diverged model, a lost tab, GPU or server; most may be rejoined. */
function trainingAdvice(e: Error, fixed: boolean): Advice {
  if (e instanceof NonFiniteGradientError)
    return [
      'Training diverged',
      'A gradient became NaN or infinite. Try a lower learning rate in a new session; if it persists, a tab of this session may be sending bad gradients.',
      false,
    ];
  if (e instanceof ReplicaDivergenceError)
    return [
      'Replicas differ',
      'The named ranks no longer hold the same weights as the others (a faulty or tampered tab). Start a new session without them.',
      false,
    ];
  if (e instanceof RankStalledError) {
    const others = fixed
      ? 'the other tabs wait for this one to take its place again'
      : 'the other tabs train on and take this one back at their next step';
    return [
      'This tab was paused',
      `Continue training to rejoin: ${others}. To avoid this, keep the computer awake and this tab in a window of its own.`,
      true,
    ];
  }
  if (e instanceof DeviceLostError) {
    return [
      'This tab lost its GPU',
      "The GPU was reset (a driver crash or update, or the computer switched graphics cards) and the model on it is gone. Continue training to rejoin: this tab gets the group's state from the other tabs, or the latest checkpoint.",
      true,
    ];
  }
  if (e instanceof PeerLostError)
    return [
      `Rank ${e.rank} was lost`,
      'Continue training to rejoin: the session goes on from the live replicas or its latest checkpoint.',
      true,
    ];
  if (e instanceof ConnectionClosedError || e instanceof DistTimeoutError)
    return ['Server unreachable', 'Check that "npm start" is running on the host, then continue training.', true];
  return [
    `Unexpected error: ${e.name}`,
    'Continue training to rejoin the session. If it happens again, create a new session and report the message above.',
    true,
  ];
}
