/**
 * DDP's communication hook as the train job's `commHook` option (the launcher's --comm-hook):
 * the spec, its text (`powersgd:2:fp16`) both ways, its bounds, and which strategies and
 * pipelines a hook combines with (checkCommHook, for train_config.ts).
 */
import { ConfigError } from './config_option.ts';

/**
 * DDP's communication hook (the launcher's --comm-hook), parsed: how each step's gradients travel.
 * 'none': the plain float32 ring all-reduce. 'fp16' / 'bf16': the same all-reduce with 16-bit
 * values on the wire (torch's fp16_compress_hook, bf16_compress_hook). 'powersgd': low-rank
 * compression of rank `rank`, plain all-reduces for steps 1 .. startIter (torch's powerSGD_hook,
 * start_powerSGD_iter), its all-reduces float32 or, with `wire`, 16-bit (torch's fp16_compress_wrapper
 * around the hook). 'localsgd': averaged gradients for steps 1 .. startStep, then local steps
 * with the models averaged every `period` steps (torch's post_localSGD_hook with a
 * PeriodicModelAverager). 'diloco': DiLoCo, an outer step every `syncEvery` inner steps with
 * the outer SGD's learning rate and momentum (Nesterov when the momentum is not 0), its
 * pseudo-gradients float32, 16-bit or int8 (blocks of 32 with a power-of-two scale) on the wire; `stream` P > 0: streaming DiLoCo, P fragments
 * with staggered outer steps (0: off), each all-reduce overlapped with the next `overlap` inner steps
 * (`streamPxD`: D; default 1; 0 without streaming).
 */
export type CommHookSpec =
  | { kind: 'none' }
  | { kind: 'fp16' }
  | { kind: 'bf16' }
  | { kind: 'powersgd'; rank: number; startIter: number; wire: PowerSGDWire }
  | { kind: 'localsgd'; period: number; startStep: number }
  | { kind: 'diloco'; syncEvery: number; outerLr: number; outerMomentum: number; wire: DiLoCoWire; stream: number; overlap: number };
/** What PowerSGD's all-reduces send: float32, or 16-bit as under torch's fp16/bf16_compress_wrapper (`powersgd:R:fp16`, `powersgd:R:bf16`). */
export type PowerSGDWire = 'float32' | 'float16' | 'bfloat16';
const POWERSGD_WIRES: Record<string, PowerSGDWire> = { fp16: 'float16', bf16: 'bfloat16' };
/** What DiLoCo's pseudo-gradients travel as: PowerSGD's choices, or int8 (`diloco:H:int8`; the Streaming DiLoCo paper sends 4-bit ones). */
export type DiLoCoWire = PowerSGDWire | 'int8';
const DILOCO_WIRES: Record<string, DiLoCoWire> = { ...POWERSGD_WIRES, int8: 'int8' };
/** Each wire type as the text's last item (formatCommHook). */
const WIRE_SUFFIX: Record<DiLoCoWire, string> = { float32: '', float16: ':fp16', bfloat16: ':bf16', int8: ':int8' };
/** Every value type a hook's wire may be (a summary's `wire`). */
export const COMM_HOOK_WIRE_TYPES = Object.keys(WIRE_SUFFIX) as readonly DiLoCoWire[];
/** torch's start_powerSGD_iter default, and the same warm-up for local SGD. */
export const DEFAULT_COMM_HOOK_START = 10;
/** Bounds: a rank beyond the model's widest matrix compresses nothing; a START beyond any run. */
export const MAX_POWERSGD_RANK = 1024;
export const MAX_LOCALSGD_PERIOD = 1_000_000;
export const MAX_COMM_HOOK_START = 10_000_000;
/** DiLoCo's defaults: the paper's outer learning rate and Nesterov momentum. */
export const DEFAULT_DILOCO_OUTER_LR = 0.7;
export const DEFAULT_DILOCO_OUTER_MOMENTUM = 0.9;

/** A wire item's words, `:fp16|:bf16`, as the grammar writes them. */
const wireItems = (wires: Record<string, unknown>): string =>
  Object.keys(wires)
    .map((w) => `:${w}`)
    .join('|');

/**
 * The one rule of the option's text: each hook's name and form (the launcher's usage, the
 * option's rule and the parser's errors all print these). parseCommHook reads exactly these.
 */
export const COMM_HOOK_FORMS = {
  none: 'none',
  fp16: 'fp16',
  bf16: 'bf16',
  powersgd: `powersgd:RANK[:START][${wireItems(POWERSGD_WIRES)}]`,
  localsgd: 'localsgd:H[:START]',
  diloco: `diloco:H[:OUTER_LR[:MOMENTUM]][:streamP[xD]][${wireItems(DILOCO_WIRES)}]`,
} as const satisfies Record<CommHookSpec['kind'], string>;
/** Every hook's name, in the grammar's order. */
export const COMM_HOOK_NAMES = Object.keys(COMM_HOOK_FORMS) as ReadonlyArray<CommHookSpec['kind']>;
/** The words a last wire item may be, after powersgd's numbers and after diloco's. */
export const COMM_HOOK_WIRES = { powersgd: Object.keys(POWERSGD_WIRES), diloco: Object.keys(DILOCO_WIRES) } as const;

/** The grammar in one line: every form, `|` between them (the launcher's usage). */
export const COMM_HOOK_GRAMMAR = COMM_HOOK_NAMES.map((k) => COMM_HOOK_FORMS[k]).join('|');

/** What the option may be, in words (the option's rule, and the error for an unknown hook). */
export const COMM_HOOK_RULE = `${COMM_HOOK_NAMES.slice(0, -1)
  .map((k) => COMM_HOOK_FORMS[k])
  .join(
    ', ',
  )} or ${COMM_HOOK_FORMS[COMM_HOOK_NAMES.at(-1)!]} (e.g. fp16, powersgd:2, powersgd:2:fp16, localsgd:4, diloco:64 or diloco:64:stream4)`;

/**
 * The option's text as a CommHookSpec: one of COMM_HOOK_FORMS. RANK and H are positive
 * integers; START (the steps of plain, averaged gradients first, default 10) an integer >= 0;
 * OUTER_LR and MOMENTUM decimals; a last wire item sends the hook's values 16-bit (or, for
 * diloco, int8). Throws ConfigError (option commHook) naming the item that is wrong and what to write.
 */
export function parseCommHook(raw: string): CommHookSpec {
  const [kind = '', ...args] = raw.split(':');
  const bad: Bad = (rule: string) => new ConfigError('commHook', raw, rule);
  const item = itemReader(bad);
  switch (kind) {
    case 'none':
    case 'fp16':
    case 'bf16':
      if (args.length > 0) throw bad(`just ${kind}, without "${args.join(':')}" after it`);
      return { kind };
    case 'powersgd':
      return parsePowerSGD(args, bad, item);
    case 'localsgd':
      return parseLocalSGD(args, bad, item);
    case 'diloco':
      return parseDiLoCo(args, bad, item);
    default:
      throw bad(`${COMM_HOOK_RULE}; "${kind}" is not a hook`);
  }
}

/** The errors of parseCommHook: ConfigError (option commHook) for the raw text, with `rule` saying what to write. */
type Bad = (rule: string) => ConfigError;
/** `item` (RANK, H, START) of `form` as a whole number in least..most; the error says what it is for and shows `example`. */
type Item = (name: string, text: string | undefined, least: number, most: number, form: string, what: string, example: string) => number;

function itemReader(bad: Bad): Item {
  return (name: string, text: string | undefined, least: number, most: number, form: string, what: string, example: string): number => {
    const n = text !== undefined && /^\d{1,16}$/.test(text) ? Number(text) : NaN;
    if (Number.isSafeInteger(n) && n >= least && n <= most) return n;
    const range = least === 1 ? `a positive integer up to ${most}` : `an integer from ${least} to ${most}`;
    const problem = text === undefined || text === '' ? `${name} is missing` : `${name} "${text}" is not one`;
    throw bad(`${form} with ${name} ${range}, ${what} (e.g. ${example}); ${problem}`);
  };
}

/** powersgd:RANK[:START][:fp16|bf16]. */
function parsePowerSGD(args: string[], bad: Bad, item: Item): Extract<CommHookSpec, { kind: 'powersgd' }> {
  // A last item fp16 or bf16: P, Q and the rest go 16-bit on the wire.
  const last = args[args.length - 1];
  const wire = last !== undefined && last in POWERSGD_WIRES && args.length > 1 ? POWERSGD_WIRES[last]! : 'float32';
  const numbers = wire === 'float32' ? args : args.slice(0, -1);
  if (numbers.length > 2)
    throw bad(
      `${COMM_HOOK_FORMS.powersgd} (e.g. powersgd:2, powersgd:2:100 or powersgd:2:fp16): at most two numbers after powersgd, then optionally ${COMM_HOOK_WIRES.powersgd.join(' or ')}`,
    );
  const rank = item('RANK', numbers[0], 1, MAX_POWERSGD_RANK, 'powersgd:RANK', 'the rank of the low-rank approximation', 'powersgd:2');
  const startIter =
    numbers.length < 2
      ? DEFAULT_COMM_HOOK_START
      : item(
          'START',
          numbers[1],
          0,
          MAX_COMM_HOOK_START,
          `powersgd:${rank}:START`,
          'the steps of plain all-reduce before compression starts',
          `powersgd:${rank}:100`,
        );
  return { kind: 'powersgd', rank, startIter, wire };
}

/** localsgd:H[:START]. */
function parseLocalSGD(args: string[], bad: Bad, item: Item): Extract<CommHookSpec, { kind: 'localsgd' }> {
  if (args.length > 2) throw bad('localsgd:H or localsgd:H:START (e.g. localsgd:4 or localsgd:4:100): at most two numbers after localsgd');
  const period = item('H', args[0], 1, MAX_LOCALSGD_PERIOD, 'localsgd:H', 'the steps between two averagings of the models', 'localsgd:4');
  const startStep =
    args.length < 2
      ? DEFAULT_COMM_HOOK_START
      : item(
          'START',
          args[1],
          0,
          MAX_COMM_HOOK_START,
          `localsgd:${period}:START`,
          'the steps of averaged gradients before local steps start',
          `localsgd:${period}:100`,
        );
  return { kind: 'localsgd', period, startStep };
}

/** diloco:H[:OUTER_LR[:MOMENTUM]][:streamP[xD]][:fp16|bf16|int8]. */
function parseDiLoCo(args: string[], bad: Bad, item: Item): Extract<CommHookSpec, { kind: 'diloco' }> {
  let rest = args;
  const last = rest[rest.length - 1];
  const wire = last !== undefined && last in DILOCO_WIRES && rest.length > 1 ? DILOCO_WIRES[last]! : 'float32';
  if (wire !== 'float32') rest = rest.slice(0, -1);
  const form = `${COMM_HOOK_FORMS.diloco} (e.g. diloco:64, diloco:64:0.7:0.9, diloco:64:stream4, diloco:128:stream4x8, diloco:64:fp16 or diloco:64:stream4:int8)`;
  const streamItem = rest.length > 1 && /^stream/.test(rest[rest.length - 1]!) ? rest[rest.length - 1]! : undefined;
  if (streamItem !== undefined) rest = rest.slice(0, -1);
  const numbers = rest;
  if (numbers.length > 3)
    throw bad(`${form}: at most three numbers after diloco, then optionally streamP, then ${COMM_HOOK_WIRES.diloco.join(', ')}`);
  const syncEvery = item('H', numbers[0], 1, MAX_LOCALSGD_PERIOD, 'diloco:H', 'the inner steps between two outer steps', 'diloco:64');
  /** A decimal in (least, most) or [least, most), for the outer learning rate and momentum. */
  const decimal = (name: string, text: string | undefined, ok: (n: number) => boolean, rule: string): number => {
    const n = text !== undefined && /^\d{1,6}(\.\d{1,12})?$/.test(text) ? Number(text) : NaN;
    if (Number.isFinite(n) && ok(n)) return n;
    throw bad(`${form} with ${name} ${rule}; "${text ?? ''}" is not one`);
  };
  const outerLr =
    numbers.length < 2
      ? DEFAULT_DILOCO_OUTER_LR
      : decimal(
          'OUTER_LR',
          numbers[1],
          (n) => n > 0 && n <= 100,
          "a decimal number above 0 and up to 100 (the outer SGD's learning rate, e.g. 0.7)",
        );
  const outerMomentum =
    numbers.length < 3
      ? DEFAULT_DILOCO_OUTER_MOMENTUM
      : decimal(
          'MOMENTUM',
          numbers[2],
          (n) => n >= 0 && n < 1,
          'a decimal number from 0 to below 1 (the outer Nesterov momentum, e.g. 0.9; 0 for none)',
        );
  const { stream, overlap } = streamItem === undefined ? { stream: 0, overlap: 0 } : parseStream(streamItem, syncEvery, form, bad);
  return { kind: 'diloco', syncEvery, outerLr, outerMomentum, wire, stream, overlap };
}

/** DiLoCo's streamP or streamPxD item: P fragments, each all-reduce D inner steps behind. */
function parseStream(streamItem: string, syncEvery: number, form: string, bad: Bad): { stream: number; overlap: number } {
  // Each fragment's all-reduce overlaps the next D inner steps (default 1) and lands before that fragment's next turn: D < H / P.
  const most = Math.floor(syncEvery / 2);
  const m = /^stream(\d{1,7})(?:x(\d{1,7}))?$/.exec(streamItem);
  const p = m ? Number(m[1]) : NaN;
  if (!(Number.isSafeInteger(p) && p >= 1 && p <= most)) {
    throw bad(
      `${form} with streamP: P fragments from 1 to H / 2 (here ${most}), each all-reduce overlapped with the next inner step (streamPxD: the next D); "${streamItem}" is not one`,
    );
  }
  const d = m?.[2] === undefined ? 1 : Number(m[2]);
  const gap = syncEvery / p;
  if (!(d >= 1 && d < gap))
    throw bad(
      `${form} with streamPxD: D inner steps an all-reduce runs behind, from 1 to below H / P (here ${gap}); "${streamItem}" is not one`,
    );
  return { stream: p, overlap: d };
}

/** A CommHookSpec as the option's text (what parseCommHook reads back), START only when not the default. */
export function formatCommHook(spec: CommHookSpec): string {
  switch (spec.kind) {
    case 'powersgd':
      return `powersgd:${spec.rank}${spec.startIter === DEFAULT_COMM_HOOK_START ? '' : `:${spec.startIter}`}${WIRE_SUFFIX[spec.wire]}`;
    case 'localsgd':
      return `localsgd:${spec.period}${spec.startStep === DEFAULT_COMM_HOOK_START ? '' : `:${spec.startStep}`}`;
    case 'diloco': {
      const lr = spec.outerLr !== DEFAULT_DILOCO_OUTER_LR || spec.outerMomentum !== DEFAULT_DILOCO_OUTER_MOMENTUM ? `:${spec.outerLr}` : '';
      const momentum = spec.outerMomentum !== DEFAULT_DILOCO_OUTER_MOMENTUM ? `:${spec.outerMomentum}` : '';
      return `diloco:${spec.syncEvery}${lr}${momentum}${spec.stream > 0 ? `:stream${spec.stream}${spec.overlap > 1 ? `x${spec.overlap}` : ''}` : ''}${WIRE_SUFFIX[spec.wire]}`;
    }
    default:
      return spec.kind;
  }
}

/** Hooks are DDP's: refused with a parameter-server strategy and, for now, with pipelines. Throws ConfigError. */
export function checkCommHook(raw: string, spec: CommHookSpec, strategy: string, pp: number): void {
  if (spec.kind === 'none') return;
  if (strategy !== 'ddp') {
    throw new ConfigError(
      'commHook',
      raw,
      `none (or left out) with strategy ${strategy}: communication hooks replace DDP's all-reduce, and with parameter servers the workers push their gradients to the servers instead (leave out commHook, or strategy)`,
    );
  }
  if (pp > 1) {
    throw new ConfigError(
      'commHook',
      raw,
      `none (or left out) with pipeline stages (here pp ${pp}): communication hooks with pipelines are not supported yet (leave out commHook, or pp)`,
    );
  }
}
