/**
 * The HTTP side of the checkpoint routes (checkpoints.ts): the expected refusals, the session-token
 * check every route makes, an upload's body read within its deadlines, and the responses.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { FileHandle } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import type { SessionTokens } from './session_tokens.ts';
import { ROTATED_TOKEN_MESSAGE } from '../src/wire/protocol.ts';
import type { ByteSource, Skipped } from './checkpoint_store.ts';

/** `Authorization: Bearer <token>`; the scheme is case-insensitive (RFC 7235). */
const BEARER = /^Bearer +(\S+) *$/i;

/** An expected refusal: answered as {error: code, message} without a stack in the log. */
export class Refusal extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

/** The request's token when it is the session's; throws a 401 or 403 Refusal otherwise. */
export async function authorize(tokens: SessionTokens, req: IncomingMessage, session: string): Promise<string> {
  const header = req.headers.authorization;
  const token = header === undefined ? undefined : BEARER.exec(header)?.[1];
  if (token === undefined) {
    throw new Refusal(
      401,
      'unauthorized',
      `checkpoints of session "${session}" need the session's token: send "Authorization: Bearer <token>" (the #token=... of the session's link)`,
      { 'www-authenticate': 'Bearer realm="checkpoints"' },
    );
  }
  switch (await tokens.verify(session, token)) {
    case 'ok':
      return token;
    case 'missing':
      throw new Refusal(
        401,
        'unauthorized',
        `the bearer token is not a session token (22-128 characters of A-Z a-z 0-9 _ -): send the #token=... of session "${session}"'s link`,
        { 'www-authenticate': 'Bearer realm="checkpoints", error="invalid_token"' },
      );
    case 'wrong':
      if (tokens.wasRotated(session, token)) throw new Refusal(403, 'forbidden', `session "${session}": ${ROTATED_TOKEN_MESSAGE}`);
      throw new Refusal(403, 'forbidden', `wrong token for session "${session}": use the token of the session's link`);
    case 'unknown':
      throw new Refusal(
        403,
        'forbidden',
        `session "${session}" has no token yet: connect to the session first (its first connection fixes the token), then use that token`,
      );
  }
}

/**
 * An upload's body, chunk by chunk, within a deadline for the whole body and a shorter one for
 * each wait (a client that stalls). Failures are Refusals: 408 on time, 400 when it broke off.
 */
export class BodyReader implements ByteSource {
  private readonly chunks: AsyncIterator<Buffer>;
  private readonly deadline: number;
  private received = 0;
  /** The body's first bytes, kept by `firstBytes`. */
  private start: Buffer[] = [];
  private startBytes = 0;

  constructor(
    req: IncomingMessage,
    private readonly declared: number,
    private readonly totalMs: number,
    private readonly idleMs: number,
  ) {
    this.chunks = (req as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
    this.deadline = Date.now() + totalMs;
  }

  /** All bytes received so far, after reading until there are at least `n` (first call first). */
  async firstBytes(n: number): Promise<Buffer> {
    while (this.startBytes < n) {
      const chunk = await this.next();
      if (chunk === null) break; // not reached: next() refuses a body shorter than declared
      this.start.push(chunk);
      this.startBytes += chunk.length;
    }
    this.start = [Buffer.concat(this.start, this.startBytes)];
    return this.start[0]!;
  }

  /** The next chunk, or null at the end of the body. */
  async next(): Promise<Buffer | null> {
    const left = this.deadline - Date.now();
    const idle = this.idleMs < left;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<'timeout'>((done) => {
      timer = setTimeout(() => done('timeout'), Math.max(0, idle ? this.idleMs : left));
    });
    let result: IteratorResult<Buffer> | 'timeout';
    try {
      // The losing next() stays pending until the connection closes; race() has handled its rejection.
      result = await Promise.race([this.chunks.next(), timeout]);
    } catch (err) {
      throw this.brokeOff(err instanceof Error ? err.message : String(err));
    } finally {
      clearTimeout(timer);
    }
    const got = `${this.received} of ${this.declared} bytes`;
    if (result === 'timeout' && idle) {
      throw new Refusal(
        408,
        'timeout',
        `the checkpoint upload stalled: nothing arrived for ${this.idleMs} ms after ${got} (uploadIdleTimeoutMs); nothing was stored: save it again`,
      );
    }
    if (result === 'timeout') {
      throw new Refusal(
        408,
        'timeout',
        `the checkpoint upload took too long: ${got} arrived in ${this.totalMs} ms, the most this server waits for one (uploadTimeoutMs); nothing was stored: retry over a faster connection or save a smaller checkpoint`,
      );
    }
    if (result.done) {
      if (this.received !== this.declared) throw this.brokeOff('the body ended early');
      return null;
    }
    this.received += result.value.length;
    if (this.received > this.declared) throw this.brokeOff('more bytes than its Content-Length'); // node's parser prevents it
    return result.value;
  }

  private brokeOff(why: string): Refusal {
    return new Refusal(
      400,
      'incomplete',
      `the checkpoint upload broke off after ${this.received} of ${this.declared} bytes (${why}); nothing was stored: save it again`,
    );
  }
}

/** Streams a checkpoint file (and closes it). */
export async function sendFile(res: ServerResponse, fh: FileHandle, name: string, skipped: Skipped[]): Promise<void> {
  try {
    const { size } = await fh.stat();
    res.writeHead(200, {
      'content-type': 'application/octet-stream',
      'content-length': size,
      'cache-control': 'no-store',
      'x-checkpoint-name': name,
      'x-checkpoint-skipped': asciiJson(skipped),
    });
  } catch (err) {
    await fh.close();
    throw err;
  }
  await pipeline(fh.createReadStream({ start: 0, autoClose: true }), res);
}

export function sendJson(res: ServerResponse, status: number, body: object): void {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
  res.end(JSON.stringify(body));
}

/** Errors are {error: a stable code, message: for a person}. */
export function sendError(res: ServerResponse, status: number, error: string, message: string): void {
  sendJson(res, status, { error, message });
}

export function methodNotAllowed(res: ServerResponse, allow: string): void {
  res.setHeader('allow', allow);
  sendError(res, 405, 'method', `use ${allow}`);
}

/** JSON with non-ASCII escaped: header values must be Latin-1, and reasons may quote any text. */
function asciiJson(value: unknown): string {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/**
 * Answers a route that failed: a Refusal as {error, message} with its status (no stack in the
 * log), anything else as a 500; a response already under way is cut off.
 */
export function answerFailure(
  req: IncomingMessage,
  res: ServerResponse,
  pathname: string,
  err: unknown,
  log: (line: string) => void,
): void {
  if (err instanceof Refusal) {
    log(`[checkpoints] ${req.method} ${pathname} from ${req.socket.remoteAddress ?? 'unknown'}: ${err.status} ${err.code}: ${err.message}`);
    if (res.headersSent) {
      res.destroy();
      return;
    }
    // An unread body is not worth reading (it may be large, or stalled): close after answering.
    if (!req.complete) res.setHeader('connection', 'close');
    for (const [k, v] of Object.entries(err.headers)) res.setHeader(k, v);
    sendError(res, err.status, err.code, err.message);
    return;
  }
  log(`[checkpoints] ${req.method} ${pathname} failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
  if (!res.headersSent) sendError(res, 500, 'internal', `the server could not handle this: ${String(err)}`);
  else res.destroy();
}
