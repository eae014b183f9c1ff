/**
 * DDP's communication hook slot (torch's `register_comm_hook`): the plain all-reduce until a hook
 * is registered, once, before the first backward; the hook's state both ways; and a bucket
 * reduced by it, its result checked.
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { allreduceHook } from '../comm_hooks/default_hooks.ts';
import type { CommHook, CommHookState, GradBucket, LoadCommHookStateOptions } from '../comm_hooks/types.ts';

export class HookSlot {
  private current: CommHook = allreduceHook();
  private registered = false;

  /** The registered hook, else the default `allreduceHook()`. */
  get hook(): CommHook {
    return this.current;
  }

  /** Registers `hook` (see DistributedDataParallel.registerCommHook); `syncs`: synchronised backwards so far; `check`: the DDP's own refusal. */
  register(hook: CommHook, syncs: number, check: (hook: CommHook) => void): void {
    if (this.registered) {
      throw new Error(
        `a communication hook is already registered (${this.current.name}); registerCommHook can only be called once (as torch's register_comm_hook)`,
      );
    }
    if (syncs > 0) {
      throw new Error(
        `registerCommHook must be called before the first backward; ${syncs} synchronised backward(s) already ran with ${this.current.name}`,
      );
    }
    if (!hook || typeof hook.reduce !== 'function' || typeof hook.name !== 'string') {
      throw new TypeError('registerCommHook takes a CommHook: { name, reduce(pg, bucket) } (see comm_hooks/)');
    }
    check(hook);
    this.current = hook;
    this.registered = true;
  }

  state(): CommHookState | null {
    return this.current.stateDict?.() ?? null;
  }

  load(state: CommHookState, options?: LoadCommHookStateOptions): void {
    const hook = this.current;
    if (state.name !== hook.name)
      throw new Error(`the communication hook state is ${state.name}'s, but the registered hook is ${hook.name}`);
    if (!hook.loadStateDict) throw new Error(`the communication hook ${hook.name} keeps no state to load`);
    hook.loadStateDict(state, options);
  }

  /** `bucket` reduced by the hook, its result copied into the bucket's buffer unless the hook reduced in place. */
  async reduce(pg: ProcessGroup, bucket: GradBucket): Promise<Float32Array> {
    const view = bucket.buffer;
    const out = await this.current.reduce(pg, bucket);
    if (out !== view) {
      if (!(out instanceof Float32Array) || out.length !== view.length) {
        throw new TypeError(
          `the communication hook ${this.current.name} returned ${out instanceof Float32Array ? `${out.length} values` : String(out)} for bucket ${bucket.index}, which has ${view.length}`,
        );
      }
      view.set(out);
    }
    return view;
  }
}
