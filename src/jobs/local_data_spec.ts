/**
 * "Each tab's own pictures" (dataset `local`) as the train job's options: the class names the
 * host sets (`classes`), the pictures' size (`imageSize`, square) and colour (`color`). Every tab
 * adds its own pictures of these classes; they never leave it (client/train/pictures.ts, and the
 * library's LocalDataset). Their rules, each bad value named with what to type instead, are here
 * for train_config.ts.
 */
import { ConfigError, type OptionSpec } from './config_option.ts';

export const MIN_CLASSES = 2;
export const MAX_CLASSES = 10;
export const MAX_CLASS_NAME = 24;
/** The pictures' side in pixels: 8 is still a picture, 128 x 128 x 3 floats (192 KiB) each keeps hundreds in a tab. */
export const MIN_IMAGE_SIZE = 8;
export const MAX_IMAGE_SIZE = 128;
export const DEFAULT_IMAGE_SIZE = 32;
export const COLORS = ['rgb', 'gray'] as const;
export type ColorName = (typeof COLORS)[number];
/** What a new session starts with, as Teachable Machine's "Class 1" and "Class 2". */
export const DEFAULT_CLASSES = 'Class 1,Class 2';

/** Letters of any script, digits, spaces and - _ ' . : a name a teacher types, shown as text only. */
const NAME = /^[\p{L}\p{N}][\p{L}\p{N} _'’.-]*$/u;

/** What the classes option may be, in words (the form and the link's error say it). */
export const CLASSES_RULE = `${MIN_CLASSES} to ${MAX_CLASSES} class names separated by commas, each 1-${MAX_CLASS_NAME} letters, digits, spaces, - _ ' or . (e.g. rock,paper,scissors)`;

/** The local-data part of the job's configuration: null unless the dataset is `local`. */
// A type, not an interface: the configuration must stay assignable to Json.
export type LocalDataConfig = {
  classes: string[];
  /** The pictures' side, px: each is resized in its tab to imageSize x imageSize. */
  imageSize: number;
  /** 3: red, green, blue; 1: grey (luminance). */
  channels: 1 | 3;
};

const local = (p: Partial<Record<string, unknown>>) => p.dataset === 'local';

/**
 * The options, spread into the schema after `dataset` (their defaults read it). The text's own
 * pattern only bounds its length: parseLocalData names what is wrong (a count, a name, a repeat).
 */
export const LOCAL_DATA_OPTIONS = [
  {
    name: 'classes',
    kind: { type: 'text', pattern: /^\P{Cc}{1,400}$/u, rule: CLASSES_RULE },
    inForm: true,
    defaultValue: (p) => (local(p) ? DEFAULT_CLASSES : null),
  },
  {
    name: 'imageSize',
    kind: { type: 'int', min: MIN_IMAGE_SIZE, max: MAX_IMAGE_SIZE },
    inForm: true,
    defaultValue: (p) => (local(p) ? DEFAULT_IMAGE_SIZE : null),
  },
  { name: 'color', kind: { type: 'choice', choices: COLORS }, inForm: true, defaultValue: (p) => (local(p) ? 'rgb' : null) },
] as const satisfies readonly OptionSpec[];

/** The options' names, which only a session of the tabs' own pictures takes. */
export const LOCAL_DATA_OPTION_NAMES: readonly string[] = LOCAL_DATA_OPTIONS.map((o) => o.name);

/** The class names of `raw` ("rock, paper,scissors"), trimmed; throws ConfigError naming what is wrong. */
export function parseClasses(raw: string): string[] {
  const names = raw.split(',').map((n) => n.trim());
  const bad = (why: string) => new ConfigError('classes', raw, `${CLASSES_RULE}; ${why}`);
  if (names.length < MIN_CLASSES || names.length > MAX_CLASSES) throw bad(`this has ${names.length} name${names.length === 1 ? '' : 's'}`);
  const seen = new Map<string, number>();
  names.forEach((name, i) => {
    if (name === '') throw bad(`name ${i + 1} is empty (two commas in a row, or one at an end)`);
    if ([...name].length > MAX_CLASS_NAME) throw bad(`"${name}" is ${[...name].length} characters long`);
    if (!NAME.test(name)) throw bad(`"${name}" has a character that is not allowed`);
    const key = name.toLocaleLowerCase();
    const before = seen.get(key);
    if (before !== undefined) throw bad(`"${name}" is there twice (names ${before + 1} and ${i + 1}): each class needs a name of its own`);
    seen.set(key, i);
  });
  return names;
}

/**
 * The local-data options against the rest: all three only with dataset `local` (where each has
 * its default), and that dataset only where the DDP runner trains it (its localData option): the
 * built-in image models, DDP without pipelines, every tab's own samples whole. Throws ConfigError.
 */
export function checkLocalData(values: Record<string, unknown>): LocalDataConfig | null {
  const classes = values.classes as string | null;
  const imageSize = values.imageSize as number | null;
  const color = values.color as ColorName | null;
  if (values.dataset !== 'local') {
    const given = (
      [
        ['classes', classes],
        ['imageSize', imageSize],
        ['color', color],
      ] as const
    ).find(([, v]) => v !== null);
    if (given)
      throw new ConfigError(
        given[0],
        String(given[1]),
        "left out unless the dataset is local (each tab's own pictures): it says what those pictures are",
      );
    return null;
  }
  const model = values.model as string;
  if (model !== 'mlp' && model !== 'cnn')
    throw new ConfigError('model', model, "mlp or cnn with dataset local: each tab's own pictures train one of the built-in image models");
  if (values.strategy !== 'ddp' || (values.pp as number) > 1)
    throw new ConfigError(
      values.strategy !== 'ddp' ? 'strategy' : 'pp',
      String(values.strategy !== 'ddp' ? values.strategy : values.pp),
      "ddp without pipeline stages (leave out strategy and pp) with dataset local: each tab's pictures train its own replica, averaged by DDP",
    );
  if (values.balance === true)
    throw new ConfigError(
      'balance',
      'true',
      'false (or left out) with dataset local: each step is split by the pictures each tab has left, not by its speed',
    );
  if ((values.trainSize as number) !== 0)
    throw new ConfigError('trainSize', String(values.trainSize), 'left out with dataset local: each tab trains on all of its own pictures');
  if ((values.testSize as number) !== 0)
    throw new ConfigError(
      'testSize',
      String(values.testSize),
      'left out with dataset local: each tab evaluates on its own held-out pictures (1 in 5)',
    );
  return { classes: parseClasses(classes!), imageSize: imageSize!, channels: color === 'gray' ? 1 : 3 };
}

/** The options' values that reproduce `local` in a link (configParams). */
export function localDataParams(local: LocalDataConfig | null): Record<string, unknown> {
  if (!local) return { classes: null, imageSize: null, color: null };
  return { classes: local.classes.join(','), imageSize: local.imageSize, color: local.channels === 1 ? 'gray' : 'rgb' };
}

/** The shape of one picture of `local`: [size, size, channels] (the models' image input). */
export function localInputShape(local: LocalDataConfig): number[] {
  return [local.imageSize, local.imageSize, local.channels];
}
