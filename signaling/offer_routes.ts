/**
 * The offer's HTTP routes (GET /api/offer...; the list is in offer.ts), kept apart from reading
 * and checking the host's files (offer.ts): here only what a request may get, once the files are
 * known good, and how their bytes are sent within the bounds of `FileSends`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join, relative, sep } from 'node:path';
import type { Readable } from 'node:stream';
import { validSession } from './checkpoint_store.ts';
import { bufferStream, FILE_SEND_CHUNK_BYTES, FILE_SEND_RETRY_AFTER_S, FileSends } from './limits.ts';
import { type Offer, type OfferedData, type OfferedModel, type OfferFiles, type OfferOptions, openRegular, readOffer } from './offer.ts';
import type { SessionTokens } from './session_tokens.ts';

const BEARER = /^Bearer +(\S+) *$/i;

// Both answer the request, so a route ends with `return send(...)`.
function send(res: ServerResponse, status: number, body: unknown): true {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' }).end(JSON.stringify(body));
  return true;
}

function refuse(res: ServerResponse, status: number, error: string, message: string): true {
  return send(res, status, { error, message });
}

/** What /api/offer answers: the model's and the data's description, none of their bytes. */
function describeOffer(model: OfferedModel | null, data: OfferedData | null): Record<string, unknown> {
  return {
    model: model && {
      name: model.name,
      inputShape: model.inputShape,
      outputUnits: model.outputUnits,
      parameters: model.parameters,
      hash: model.hash,
    },
    data:
      data &&
      (data.kind === 'images'
        ? { kind: data.kind, name: data.name, classes: data.classes, length: data.items.length, inputShape: null }
        : data.kind === 'text'
          ? { kind: data.kind, name: data.name, classes: data.vocabulary, length: data.characters, inputShape: null }
          : { kind: data.kind, name: data.name, classes: data.classes, length: data.length, inputShape: [data.features] }),
  };
}

/** One request to a bytes route: who asks, for which session, and the bounds its sending takes a slot of. */
interface BytesRequest {
  req: IncomingMessage;
  res: ServerResponse;
  session: string;
  sends: FileSends;
}

/**
 * Sends `open()`'s bytes to the reader within a slot of `sends`: refused with 429/503 and
 * Retry-After when a bound is full; the body is read only as the reader takes it.
 */
async function sendBytes(
  { req, res, session, sends }: BytesRequest,
  what: string,
  type: string,
  open: () => Promise<{ body: Readable; size: number } | null>,
  gone: string,
): Promise<true> {
  const release = sends.tryStart(req.socket.remoteAddress ?? 'unknown', session);
  if (typeof release !== 'function') {
    res.setHeader('retry-after', String(FILE_SEND_RETRY_AFTER_S));
    return refuse(res, release.status, release.error, release.message);
  }
  try {
    const opened = await open();
    if (opened === null) return refuse(res, 410, 'gone', gone);
    res.writeHead(200, { 'content-type': type, 'content-length': String(opened.size), 'cache-control': 'no-store' });
    await sends.stream(res, opened.body, what);
    return true;
  } finally {
    release();
  }
}

/** The request's session when its token is that session's; otherwise the request is refused here and null returned. */
async function authorizedSession(req: IncomingMessage, res: ServerResponse, url: URL, tokens: SessionTokens): Promise<string | null> {
  if (req.method !== 'GET') {
    refuse(res, 405, 'method-not-allowed', 'the offer routes answer GET only');
    return null;
  }
  const session = url.searchParams.get('session') ?? '';
  if (!validSession(session)) {
    refuse(res, 400, 'bad-session', "the offer routes need ?session=<the session's name>");
    return null;
  }
  const token = BEARER.exec(req.headers.authorization ?? '')?.[1];
  const verdict = await tokens.verify(session, token);
  if (verdict === 'ok') return session;
  const status = verdict === 'missing' ? 401 : 403;
  refuse(
    res,
    status,
    status === 401 ? 'unauthorized' : 'forbidden',
    `the host's model and data are for the tabs of a session: send "Authorization: Bearer <token>" with the #token=... of session "${session}"'s link (${verdict === 'unknown' ? 'nobody has connected to that session yet' : verdict === 'wrong' ? "this token is not that session's" : 'no well-formed token was sent'})`,
  );
  return null;
}

/** /api/offer/model and /api/offer/model/weights. */
function modelRoute(r: BytesRequest, path: string, model: OfferedModel | null): Promise<true> | true {
  if (!model) return refuse(r.res, 404, 'no-model', 'this server offers no model: start it with npm start -- --model DIR');
  if (path === '/model') return send(r.res, 200, { modelTopology: model.modelTopology, weightSpecs: model.weightSpecs });
  const weights = model.weights;
  return sendBytes(
    r,
    `GET /api/offer/model/weights (session "${r.session}")`,
    'application/octet-stream',
    () => Promise.resolve({ body: bufferStream(weights), size: weights.byteLength }),
    "the model's weights cannot be sent",
  );
}

/** /api/offer/data: what the data is, and (images) the list of items a tab then asks for by index. */
function dataListing(data: OfferedData): Record<string, unknown> {
  if (data.kind === 'text') return { kind: data.kind, name: data.name, characters: data.characters };
  return data.kind === 'images'
    ? {
        kind: data.kind,
        name: data.name,
        classes: data.classes,
        items: data.items.map(({ file, label }) => ({ file: file.split(sep).join('/'), label })),
      }
    : { kind: data.kind, name: data.name, labelColumn: data.labelColumn };
}

/** /api/offer/data/<i>: the i-th image's bytes, or (csv, text) 0: the file's text. */
function dataItemRoute(r: BytesRequest, path: string, data: OfferedData): Promise<true> | true {
  const index = Number(path.slice('/data/'.length));
  const count = data.kind === 'images' ? data.items.length : 1;
  if (!Number.isSafeInteger(index) || index < 0 || index >= count)
    return refuse(r.res, 404, 'no-such-item', `item ${path.slice(6)} is not one of the ${count} offered (0 .. ${count - 1})`);
  // Only files found at startup, by index: a request names no path.
  const file = data.kind === 'images' ? join(data.root, data.items[index]!.file) : data.file;
  const type =
    data.kind === 'csv'
      ? 'text/csv; charset=utf-8'
      : data.kind === 'text'
        ? 'text/plain; charset=utf-8'
        : data.items[index]!.kind === 'png'
          ? 'image/png'
          : 'image/jpeg';
  // Opened without following a link, and only while it is still a regular file.
  const openItem = async () => {
    const opened = await openRegular(file);
    // Exactly the bytes the Content-Length promises, should the file grow meanwhile.
    return (
      opened && {
        body: opened.fh.createReadStream({
          highWaterMark: FILE_SEND_CHUNK_BYTES,
          autoClose: true,
          start: 0,
          ...(opened.size > 0 ? { end: opened.size - 1 } : {}),
        }),
        size: opened.size,
      }
    );
  };
  return sendBytes(
    r,
    `GET /api/offer/data/${index} (session "${r.session}")`,
    type,
    openItem,
    `${relative(process.cwd(), file)} was offered at startup and cannot be read now (or is no longer a regular file)`,
  );
}

/**
 * The offer's routes over what the host offers: the options (read and checked here), or files
 * `readOffer` has read already. Every request is checked against `tokens`; the bytes routes take
 * a slot of `sends` (per address, per session, server-wide) and stream through it.
 */
export async function loadOffer(
  source: OfferOptions | OfferFiles,
  tokens: SessionTokens,
  sends: FileSends = new FileSends(),
): Promise<Offer> {
  const { model, data } = 'model' in source && 'data' in source ? source : await readOffer(source);
  const describe = () => describeOffer(model, data);

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<boolean> {
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname !== '/api/offer' && !url.pathname.startsWith('/api/offer/')) return false;
    const session = await authorizedSession(req, res, url, tokens);
    if (session === null) return true;
    const r: BytesRequest = { req, res, session, sends };
    const path = url.pathname.slice('/api/offer'.length);
    if (path === '' || path === '/') return send(res, 200, describe());
    if (path === '/model' || path === '/model/weights') return modelRoute(r, path, model);
    if (path === '/data' || path.startsWith('/data/')) {
      if (!data) return refuse(res, 404, 'no-data', 'this server offers no data: start it with npm start -- --data DIR|FILE.csv');
      if (path === '/data') return send(res, 200, dataListing(data));
      return dataItemRoute(r, path, data);
    }
    return refuse(
      res,
      404,
      'not-found',
      `${url.pathname} is not an offer route (/api/offer, /api/offer/model, /api/offer/model/weights, /api/offer/data, /api/offer/data/<i>)`,
    );
  }
  return { model, data, describe, handle };
}
