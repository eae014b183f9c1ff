/**
 * What a page link asks for, or what is wrong with it, said for a person: every bad value names
 * the parameter, the value and what is allowed, with a next step. No DOM, so the tests read the
 * same sentences the page shows (client/ui/bad_link.ts draws them).
 */
import { SESSION_NAME } from '../../src/wire/protocol.ts';
import { isSessionToken, tokenFromFragment } from '../../src/wire/session_token.ts';
import { SessionEndedError, TokenRotatedError, UnauthorizedError } from '../../src/wire/errors.ts';
import { ConfigError, MAX_WORLD_SIZE, describeRule, parseTrainConfig, urlOption, type TrainConfig } from '../../src/jobs/train_config.ts';

export interface LinkProblem {
  /** The link's parameter at fault ("world", "job", ...). */
  field: string;
  /** Its value in the link; null when the link lacks it. */
  value: string | null;
  title: string;
  /** What is wrong: the parameter, its value and what is allowed. */
  message: string;
  /** What the person can do next. */
  action: string;
  /**
   * Whether the page also offers "Create a new session" (default true). Not for a link's token:
   * the person was sent to someone else's session, and a session of their own is not what they want.
   */
  offerCreate?: boolean;
}

/** What a good link opens. */
export type LinkPlan =
  | { kind: 'create' }
  | { kind: 'train'; session: string; config: TrainConfig; rank: number | undefined; timeoutMs: number }
  | { kind: 'job'; job: string; session: string }
  | { kind: 'lobby'; session: string; world: number | undefined; rank: number | undefined };

export type LinkReading = LinkPlan | { kind: 'bad'; problem: LinkProblem };

const AGAIN = 'Open the link exactly as it was shared (copy it again from whoever sent it), or create a new session on the start page.';

/** How each parameter reads in a sentence. */
const NOUN: Readonly<Record<string, string>> = {
  world: 'the world size (how many tabs train together)',
  min: 'the minimum number of tabs',
  max: 'the maximum number of tabs',
  batchSize: 'the batch size per rank',
  lr: 'the learning rate',
  trainSize: 'the number of training samples',
  evalEvery: 'the evaluation interval (steps)',
  firstSample: 'the step of the first sample',
  checkpointEvery: 'the checkpoint interval (steps)',
  resumeFrom: 'the session to resume from',
  timeoutMs: 'the timeout (milliseconds)',
};

function bad(field: string, value: string, rule: string, action = AGAIN): LinkReading {
  const noun = NOUN[field] ?? `the ${field.replace(/[A-Z]/g, (c) => ` ${c.toLowerCase()}`)}`;
  return {
    kind: 'bad',
    problem: {
      field,
      value,
      title: 'This link is not valid',
      message: `The link says “${field}=${value}”, but ${noun} must be ${rule}.`,
      action,
    },
  };
}

/** An integer parameter in [min, max]; undefined when absent, a problem when bad. */
function intIn(params: URLSearchParams, name: string, min: number, max: number, rule?: string): number | undefined | LinkReading {
  const raw = params.get(name);
  if (raw === null || raw.trim() === '') return undefined;
  const n = Number(raw.trim());
  if (!Number.isSafeInteger(n) || n < min || n > max) return bad(name, raw, rule ?? `an integer from ${min} to ${max}`);
  return n;
}

const isProblem = (v: unknown): v is LinkReading => typeof v === 'object' && v !== null && 'kind' in v;

/**
 * Reads the page's link. `jobs`: the launcher's jobs the page knows besides `train`.
 * The token (`#token=...`) is checked where it is used (client/page_token.ts).
 */
export function readLink(params: URLSearchParams, jobs: readonly string[]): LinkReading {
  const session = params.get('session');
  const job = params.get('job');
  const allJobs = ['train', ...jobs];
  if (job !== null && !allJobs.includes(job))
    return bad('job', job, `one of ${allJobs.join(', ')}`, 'Check the link for a typo, or create a new session on the start page.');
  if (session === null || session === '') {
    if (job === null) return { kind: 'create' };
    return {
      kind: 'bad',
      problem: {
        field: 'session',
        value: null,
        title: 'This link has no session',
        message: `The link asks for job=${job} but names no session (session=NAME).`,
        action: 'Open the whole link that was shared: it names the session. Or create a new session on the start page.',
      },
    };
  }
  if (!SESSION_NAME.test(session)) return bad('session', session, '1 to 64 letters, digits, “-”, “_” or “.”');
  const timeoutMs = intIn(params, 'timeoutMs', 1000, 86_400_000);
  if (isProblem(timeoutMs)) return timeoutMs;

  if (job === 'train') {
    let config: TrainConfig;
    try {
      config = parseTrainConfig((name) => urlOption(params, name));
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      return bad(err.option, err.value, err.rule);
    }
    const rank = intIn(
      params,
      'rank',
      0,
      config.max - 1,
      `an integer from 0 to ${config.max - 1} (this session has ${config.max} rank${config.max === 1 ? '' : 's'})`,
    );
    if (isProblem(rank)) return rank;
    return { kind: 'train', session, config, rank, timeoutMs: timeoutMs ?? 3_600_000 };
  }

  const world = intIn(params, 'world', 1, MAX_WORLD_SIZE, describeRule({ type: 'int', min: 1, max: MAX_WORLD_SIZE }));
  if (isProblem(world)) return world;
  const rank = intIn(params, 'rank', 0, (world ?? MAX_WORLD_SIZE) - 1);
  if (isProblem(rank)) return rank;
  if (job !== null) return { kind: 'job', job, session };
  return { kind: 'lobby', session, world, rank };
}

const ASK_HOST = 'Ask the host for the link again, and open all of it (with its #token=... at the end).';

/**
 * What is wrong with the token in a link's fragment (`hash`, location.hash) for session
 * `session`, before anything is sent: none (null), none at all, or one of the wrong form.
 */
export function tokenProblem(hash: string, session: string): LinkProblem | null {
  const token = tokenFromFragment(hash);
  if (token === undefined) {
    return {
      field: 'token',
      value: null,
      title: 'This link has no #token',
      message: `The link ends without its #token=..., the secret that lets a tab join session “${session}”. Chat apps and some editors cut links at the #.`,
      action: ASK_HOST,
      offerCreate: false,
    };
  }
  if (isSessionToken(token)) return null;
  // Shown as text, shortened: it is whatever the link holds.
  const shown = token.length > 24 ? `${token.slice(0, 24)}…` : token;
  const why = /^[A-Za-z0-9_-]*$/.test(token) ? `this one has ${token.length}` : 'this one has other characters';
  return {
    field: 'token',
    value: token,
    title: 'This link’s #token is not valid',
    message: `The link says “#token=${shown}”, but a session’s token is 22 to 128 letters, digits, “-” or “_” (${why}): it is not one this server issued. The link was cut or changed.`,
    action: ASK_HOST,
    offerCreate: false,
  };
}

/**
 * The server refused this tab's token before it joined (a wrong token, an unknown session, a
 * link the host replaced, an ended session): what to tell the person; null for other errors.
 */
export function refusedLinkProblem(err: unknown, session: string): LinkProblem | null {
  const base = { field: 'token', value: null, offerCreate: false } as const;
  if (err instanceof TokenRotatedError) {
    return {
      ...base,
      title: 'This link is no longer valid',
      message: `The host removed a tab from session “${session}” and changed its link: this link’s #token no longer opens it.`,
      action: 'Ask the host for the new link.',
    };
  }
  if (err instanceof SessionEndedError) {
    return {
      ...base,
      title: 'This session has ended',
      message: `The host ended session “${session}”: it takes no more tabs.`,
      action: 'Ask the host for the link of a new session.',
    };
  }
  if (!(err instanceof UnauthorizedError)) return null;
  if (/does not exist on this server/.test(err.message)) {
    return {
      ...base,
      title: `No session “${session}” on this server`,
      message: `This server holds no session “${session}”: it was not created here, it was dropped after it ended, or the link is for another server.`,
      action: ASK_HOST,
    };
  }
  if (/wrong token/.test(err.message)) {
    return {
      ...base,
      title: 'This link’s #token does not open this session',
      message: `Session “${session}” exists on this server, but the #token=... in this link is not its token: the link was changed, or it is for another session of the same name.`,
      action: ASK_HOST,
    };
  }
  // A host link with a wrong host secret, or a refusal this page has no words of its own for: the server's.
  return { ...base, title: 'This link does not open this session', message: `The server refused it: ${err.message}.`, action: ASK_HOST };
}
