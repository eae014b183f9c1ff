/**
 * The launcher's usage text against the option parsers it describes: every hook and every
 * wire item parseCommHook accepts is named, and every aggregation parseAggregation accepts with
 * as many items as it takes, so the text cannot go stale as the grammars grow.
 */
import { describe, expect, it } from 'vitest';
import { USAGE } from '../launcher/usage.ts';
import { parseCommHook, type CommHookSpec } from '../src/jobs/comm_hook_spec.ts';
import { parseAggregation, type AggregationConfig } from '../src/jobs/aggregation_spec.ts';

/** One accepted text per hook; a Record over the spec's kinds, so a new kind fails to compile here until it is listed. */
const ONE_OF_EACH: Record<CommHookSpec['kind'], string> = {
  none: 'none',
  fp16: 'fp16',
  bf16: 'bf16',
  powersgd: 'powersgd:2',
  localsgd: 'localsgd:4',
  diloco: 'diloco:64',
};
/** Candidate last items: the parser decides which each hook takes. */
const ITEMS = ['fp16', 'bf16', 'int8', 'fp8', 'int4', 'stream4', 'stream4x2', 'nesterov'];

/** One accepted text per aggregation, a Record over its kinds as ONE_OF_EACH. */
const ONE_AGGREGATION_OF_EACH: Record<AggregationConfig['kind'], string> = {
  mean: 'mean',
  'trimmed-mean': 'trimmed-mean:1',
  median: 'median',
  'centered-clip': 'centered-clip',
};

/** Whether `parse` takes `text`. */
const takes = (parse: (text: string) => unknown, text: string): boolean => {
  try {
    parse(text);
    return true;
  } catch {
    return false;
  }
};
const accepts = (text: string): boolean => takes(parseCommHook, text);

/** An option's forms in the usage (`--OPTION grammar`): its grammar split at each `|` outside brackets. */
function optionForms(usage: string, option: string): string[] {
  const grammar = new RegExp(`--${option} (\\S+)`).exec(usage)?.[1] ?? '';
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
  const forms = optionForms(USAGE, 'comm-hook');

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
        const named =
          form.includes(`:${item}`) ||
          (/^stream\d+$/.test(item) && form.includes(':streamP')) ||
          (/^stream\d+x\d+$/.test(item) && form.includes(':streamP[xD]'));
        expect({ text: `${hook}:${item}`, named }).toEqual({ text: `${hook}:${item}`, named: taken });
      }
    }
  });

  it('names every aggregation the parser accepts, in its --aggregation item, and no other', () => {
    const aggregations = optionForms(USAGE, 'aggregation');
    for (const [kind, text] of Object.entries(ONE_AGGREGATION_OF_EACH)) expect(parseAggregation(text).kind).toBe(kind);
    expect(aggregations.map((f) => f.split(/[:[]/)[0]).sort()).toEqual(Object.keys(ONE_AGGREGATION_OF_EACH).sort());
  });

  it("gives each aggregation as many items as the parser takes, and names its words (centered-clip's auto)", () => {
    for (const form of optionForms(USAGE, 'aggregation')) {
      const kind = form.split(/[:[]/)[0]!;
      // The items the form shows: each `:` starts one (`[:TAU|auto]` is one item, TAU or auto).
      const items = form.split(':').length - 1;
      const withItems = (n: number) => [kind, ...Array.from({ length: n }, () => '1')].join(':');
      expect({ form, takesItems: takes(parseAggregation, withItems(items)) }).toEqual({ form, takesItems: true });
      expect({ form, takesMore: takes(parseAggregation, withItems(items + 1)) }).toEqual({ form, takesMore: false });
      for (const word of ['auto', 'max', 'none']) {
        expect({ text: `${kind}:${word}`, named: form.includes(`|${word}`) }).toEqual({
          text: `${kind}:${word}`,
          named: takes(parseAggregation, `${kind}:${word}`),
        });
      }
    }
  });
});
