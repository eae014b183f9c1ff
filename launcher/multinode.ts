/**
 * Several launchers, one world (torchrun's --nnodes/--node-rank): each machine's launcher opens
 * its `nproc` local ranks of a world of nnodes x nproc, against the one server the host runs.
 * The launchers agree through the session's store, as torchrun's agents do through theirs: each
 * posts its node's outcome under `__launch/node/<R>`, the first node to fail posts
 * `__launch/failed`, which every other launcher watches and stops on, and a launcher succeeds
 * only when every node posted success.
 */
import { StoreClient } from '../src/c10d/store.ts';

/** How long a node tries to reach its server again after it went away (restarted, or the session moved to another server). */
const RECONNECT_MS = 30_000;

export interface NodeOutcome {
  nodeRank: number;
  ok: boolean;
  errors?: string[];
}

const FAILED_KEY = '__launch/failed';
const nodeKey = (r: number) => `__launch/node/${r}`;

/** Global rank of local rank `local` on node `nodeRank` (fixed-size sessions). */
export function globalRank(nodeRank: number, nproc: number, local: number): number {
  return nodeRank * nproc + local;
}

/** Checks --nnodes/--node-rank and what a multi-node run needs; returns a message for each problem. */
export function checkMultiNode(o: { nnodes: number; nodeRank: number; server?: string; token?: string; sessionGiven: boolean }): string[] {
  const problems: string[] = [];
  if (!(Number.isInteger(o.nnodes) && o.nnodes >= 1)) problems.push(`--nnodes must be a positive integer, got ${o.nnodes}`);
  if (!(Number.isInteger(o.nodeRank) && o.nodeRank >= 0 && o.nodeRank < o.nnodes)) {
    problems.push(`--node-rank must be an integer from 0 to ${o.nnodes - 1} (--nnodes ${o.nnodes}), got ${o.nodeRank}`);
  }
  if (o.nnodes > 1) {
    // Every node must meet at the same server, session and secret: none may invent its own.
    if (!o.server) problems.push('--nnodes > 1 needs --server URL: the host runs `npm start` and every node joins it');
    if (!o.sessionGiven) problems.push('--nnodes > 1 needs --session NAME, the same on every node');
    if (!o.token)
      problems.push("--nnodes > 1 needs --token TOKEN (or SESSION_TOKEN), the same on every node: the session link's #token=...");
  }
  return problems;
}

export class NodeGroup {
  private closed = false;
  private constructor(
    private store: StoreClient,
    readonly nnodes: number,
    readonly nodeRank: number,
    private readonly reconnect: () => Promise<StoreClient>,
  ) {}

  static async join(url: string, session: string, token: string, nnodes: number, nodeRank: number, timeoutMs: number): Promise<NodeGroup> {
    const connect = () => StoreClient.connect(url, { session, token, timeoutMs });
    return new NodeGroup(await connect(), nnodes, nodeRank, connect);
  }

  /** The store, connected again if its server went away meanwhile (it restarted, or another server took the session over). */
  private async live(): Promise<StoreClient> {
    if (!this.store.isClosed || this.closed) return this.store;
    // A restarted server takes seconds to listen again on a loaded machine: try until the bound.
    const deadline = Date.now() + RECONNECT_MS;
    for (let wait = 250; ; wait = Math.min(wait * 2, 2_000)) {
      try {
        this.store = await this.reconnect();
        return this.store;
      } catch (err) {
        if (Date.now() + wait > deadline)
          throw new Error(
            `this node's store stayed unreachable for ${RECONNECT_MS / 1000} s after its server went away: ${(err as Error).message}`,
          );
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  /** Calls `onFailure` once another node (or this one) posts a failure; until close(). */
  watchFailures(onFailure: (message: string) => void, timeoutMs: number): void {
    const watch = async () => {
      while (!this.closed) {
        try {
          const value = await this.store.get(FAILED_KEY, timeoutMs);
          if (!this.closed) onFailure(new TextDecoder().decode(value));
          return;
        } catch {
          if (this.closed) return;
          // A timed-out wait just waits again; a lost server ends the watch (the run notices it too).
          if (this.store.isClosed) return;
        }
      }
    };
    void watch();
  }

  /** Posts this node's outcome; a failure also tells every other node to stop. */
  async report(outcome: NodeOutcome): Promise<void> {
    const store = await this.live();
    await store.set(nodeKey(this.nodeRank), JSON.stringify(outcome));
    if (!outcome.ok) {
      const why = `node ${this.nodeRank} failed: ${(outcome.errors ?? []).join('; ') || 'no reason given'}`;
      // The first failure is the one every node reports.
      await store.compareSet(FAILED_KEY, '', why);
    }
  }

  /** Every node's outcome, waiting up to `timeoutMs` for all of them to be posted. */
  async outcomes(timeoutMs: number): Promise<NodeOutcome[]> {
    const keys = Array.from({ length: this.nnodes }, (_, r) => nodeKey(r));
    try {
      const values = await (await this.live()).multiGet(keys, timeoutMs);
      return values.map((v) => JSON.parse(new TextDecoder().decode(v)) as NodeOutcome);
    } catch (err) {
      throw new Error(`waited ${Math.round(timeoutMs / 1000)} s for every node's outcome (${keys.join(', ')}): ${(err as Error).message}`);
    }
  }

  close(): void {
    this.closed = true;
    this.store.close();
  }
}
