/**
 * The launcher's usage text against the option parsers it describes: every hook and every
 * wire item parseCommHook accepts is named, so the text cannot go stale as the grammar grows.
 */
import { describe, expect, it } from 'vitest';
import { USAGE } from '../launcher/usage.ts';
import { parseCommHook, type CommHookSpec } from '../src/jobs/comm_hook_spec.ts';

/** One accepted text per hook; a Record over the spec's kinds, so a new kind fails to compile here until it is listed. */
const ONE_OF_EACH: Record<CommHookSpec['kind'], string> = { none: 'none', fp16: 'fp16', bf16: 'bf16', powersgd: 'powersgd:2', localsgd: 'localsgd:4', diloco: 'diloco:64' };
/** Candidate last items: the parser decides which each hook takes. */
const ITEMS = ['fp16', 'bf16', 'int8', 'fp8', 'int4', 'stream4', 'stream4x2', 'nesterov'];

const accepts = (text: string): boolean => {
  try {
    parseCommHook(text);
    return true;
  } catch {
    return false;
  }
};

/** The --comm-hook item's forms: its grammar split at each `|` outside brackets. */
function commHookForms(usage: string): string[] {
  const grammar = /--comm-hook (\S+)/.exec(usage)?.[1] ?? '';
  const forms: string[] = [];
  let depth = 0;
  let form = '';
  for (const c of grammar) {
    depth += c === '[' ? 1 : c === ']' ? -1 : 0;
    if (c === '|' && depth === 0) {
      forms.push(form);
      form = '';
    } else form += c;
  }
  return [...forms, form];
}

describe("the launcher's usage text", () => {
  const forms = commHookForms(USAGE);

  it('names every communication hook the parser accepts, in its --comm-hook item', () => {
    for (const [kind, text] of Object.entries(ONE_OF_EACH)) {
      expect(parseCommHook(text).kind).toBe(kind);
      expect(forms.map((f) => f.split(':')[0])).toContain(kind);
    }
  });

  it('names every last item a hook takes (16-bit and int8 wires, streaming)', () => {
    for (const hook of ['powersgd:2', 'localsgd:4', 'diloco:64']) {
      const kind = hook.split(':')[0]!;
      const form = forms.find((f) => f.split(':')[0] === kind) ?? '';
      for (const item of ITEMS) {
        const taken = accepts(`${hook}:${item}`);
        // streamP[xD] stands for every stream4, stream4x2, ...
        const named = form.includes(`:${item}`) || (/^stream\d+$/.test(item) && form.includes(':streamP')) || (/^stream\d+x\d+$/.test(item) && form.includes(':streamP[xD]'));
        expect({ text: `${hook}:${item}`, named }).toEqual({ text: `${hook}:${item}`, named: taken });
      }
    }
  });
});
