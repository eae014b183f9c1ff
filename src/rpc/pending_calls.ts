/**
 * The calls this worker made and waits for (agent.ts): each one's callee, function, timeout and
 * distributed autograd context, settled by its reply, its timeout or the agent's close.
 */
import { RpcTimeoutError, RpcUnreachableError } from './errors.ts';

interface Pending {
  rank: number;
  resolve(v: unknown): void;
  reject(e: Error): void;
  worker: string;
  fn: string;
  /** The context the call was made in: its reply's tensors are recorded there, and only there. */
  ctx: string | undefined;
  timer: ReturnType<typeof setTimeout> | undefined;
}

export class PendingCalls {
  private readonly calls = new Map<number, Pending>();
  private next = 1;

  constructor(
    /** Called after each call settles (the graceful shutdown waits on it). */
    private readonly onSettled: () => void,
  ) {}

  get size(): number {
    return this.calls.size;
  }

  /** A new call to `worker` (rank `rank`); rejects with RpcTimeoutError after `timeoutMs` (0: never). */
  open(rank: number, worker: string, fn: string, timeoutMs: number, ctx: string | undefined): { id: number; reply: Promise<unknown> } {
    const id = this.next++;
    const reply = new Promise<unknown>((resolve, reject) => {
      const timer = timeoutMs > 0 ? setTimeout(() => this.settle(id, new RpcTimeoutError(worker, fn, timeoutMs)), timeoutMs) : undefined;
      this.calls.set(id, { resolve, reject, worker, fn, timer, rank, ctx });
    });
    return { id, reply };
  }

  /** Call `id`, if it waits for a reply from `rank`. */
  from(id: number, rank: number): Readonly<Pending> | undefined {
    const p = this.calls.get(id);
    return p?.rank === rank ? p : undefined;
  }

  settle(id: number, outcome: Error | { value: unknown }): void {
    const p = this.calls.get(id);
    if (!p) return;
    this.calls.delete(id);
    clearTimeout(p.timer);
    if (outcome instanceof Error) p.reject(outcome);
    else p.resolve(outcome.value);
    this.onSettled();
  }

  /** Fails every call with `err` (the agent closed). */
  failAll(err: Error): void {
    for (const [id, p] of [...this.calls]) this.settle(id, new RpcUnreachableError(p.worker, p.fn, err.message, { cause: err }));
  }

  /** The calls still waiting, for a timeout's message. */
  describe(): string {
    const calls = [...this.calls.values()].map((p) => `"${p.fn}" on ${p.worker}`);
    return `this worker's ${calls.length} outstanding calls (${calls.slice(0, 5).join(', ')}) before shutdown`;
  }
}
