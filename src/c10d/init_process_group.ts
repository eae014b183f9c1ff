/**
 * torch's init_process_group: join the session's group of a fixed world size. It is the elastic
 * rendezvous (src/c10d/rendezvous.ts) with min = max = worldSize and no rejoin.
 */
import { RendezvousHandler } from './rendezvous.ts';
import type { LinkOptions, ProcessGroup } from './process_group.ts';
import type { StoreClient } from './store.ts';

export interface InitProcessGroupOptions extends LinkOptions {
  /** The server: http://host:port/ (the page's origin) or ws://host:port/ws. */
  url: string;
  session: string;
  /** The session's secret (`newSessionToken()`, a share link's `#token=...`). */
  token: string;
  worldSize: number;
  /** Explicit rank; omitted, the server assigns the lowest free one in arrival order. */
  rank?: number;
  /** How long rendezvous may take, and the default for blocking store calls. Default 300 s. */
  timeoutMs?: number;
  /** Reuse an open store connection instead of opening one. */
  store?: StoreClient;
}

/**
 * Joins the session's group of `worldSize` ranks and resolves with its process group once all
 * have joined. As in torch, the group is fixed: a rank lost breaks it for good.
 */
export async function initProcessGroup(options: InitProcessGroupOptions): Promise<ProcessGroup> {
  const { worldSize } = options;
  if (!Number.isInteger(worldSize) || worldSize < 1) {
    throw new RangeError(`worldSize must be a positive integer, got ${worldSize}`);
  }
  const handler = await RendezvousHandler.start({ ...options, min: worldSize, max: worldSize, reconnect: false });
  try {
    return (await handler.nextRendezvous(0)).pg;
  } catch (err) {
    handler.shutdown();
    throw err;
  }
}
