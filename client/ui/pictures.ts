/**
 * A tab's own pictures of the session's classes (dataset local), as the capture panel adds and
 * removes them, and the LocalDataset the tab trains on when it joins: every fifth picture of each
 * class (the 5th, 10th, ...) is held out for the tab's own evaluation. The pictures stay in this
 * tab's memory: nothing here sends anything, and the run sends only gradients and counts.
 */
import { LocalDataset } from '../../src/datasets/local.ts';
import { localInputShape, type LocalDataConfig } from '../../src/jobs/train_config.ts';

/** Every HOLD_OUT_EVERY-th picture of a class is held out (1 in 5). */
export const HOLD_OUT_EVERY = 5;
/** The most pictures a tab keeps of one class (a burst adds about ten a second): 64 px RGB, 48 KiB each, 24 MiB a class. */
export const MAX_PICTURES_PER_CLASS = 500;

export interface Picture {
  /** Unique in this set, never reused: what the panel's remove buttons name. */
  readonly id: number;
  readonly label: number;
  /** [size, size, channels] floats in 0..1, the session's input. */
  readonly pixels: Float32Array;
}

/** A picture the set refuses: the message says what was wrong and what to do. */
export class PictureSetError extends Error {
  override name = 'PictureSetError';
}

/** Per class: pictures, and of those held out for evaluation. */
export interface ClassCount {
  name: string;
  pictures: number;
  heldOut: number;
}

export class PictureSet {
  private readonly byClass: Picture[][];
  private nextId = 0;
  readonly sampleSize: number;

  constructor(readonly local: LocalDataConfig) {
    this.byClass = local.classes.map(() => []);
    this.sampleSize = localInputShape(local).reduce((a, b) => a * b, 1);
  }

  /** Adds a picture of class `label` (its index in the session's classes); returns it. */
  add(label: number, pixels: Float32Array): Picture {
    const { classes, imageSize, channels } = this.local;
    if (!Number.isInteger(label) || label < 0 || label >= classes.length)
      throw new PictureSetError(
        `class ${label} is not one of this session's ${classes.length} classes (${classes.join(', ')}): the picture was not added`,
      );
    if (pixels.length !== this.sampleSize)
      throw new PictureSetError(
        `a picture of ${pixels.length} values, expected ${this.sampleSize} (${imageSize} x ${imageSize} x ${channels}): resize it to the session's size first`,
      );
    const list = this.byClass[label]!;
    if (list.length >= MAX_PICTURES_PER_CLASS)
      throw new PictureSetError(
        `“${classes[label]}” has ${MAX_PICTURES_PER_CLASS} pictures already, the most a tab keeps of one class: remove some before adding more`,
      );
    const picture: Picture = { id: this.nextId++, label, pixels };
    list.push(picture);
    return picture;
  }

  /** Removes the picture `id`; false when there is none (removed already). */
  remove(id: number): boolean {
    for (const list of this.byClass) {
      const at = list.findIndex((p) => p.id === id);
      if (at >= 0) {
        list.splice(at, 1);
        return true;
      }
    }
    return false;
  }

  /** The pictures of class `label`, in the order they were added. */
  picturesOf(label: number): readonly Picture[] {
    return this.byClass[label] ?? [];
  }

  /** Whether the picture at `position` of its class is held out for evaluation (the 5th, 10th, ...). */
  static heldOutAt(position: number): boolean {
    return position % HOLD_OUT_EVERY === HOLD_OUT_EVERY - 1;
  }

  get size(): number {
    return this.byClass.reduce((n, list) => n + list.length, 0);
  }

  counts(): ClassCount[] {
    return this.byClass.map((list, label) => ({
      name: this.local.classes[label]!,
      pictures: list.length,
      heldOut: list.filter((_, i) => PictureSet.heldOutAt(i)).length,
    }));
  }

  /** The tab's LocalDataset: the pictures to train on, and the held-out ones for its own evaluation. */
  toDataset(name: string): LocalDataset {
    const train: Picture[] = [];
    const held: Picture[] = [];
    for (const list of this.byClass)
      list.forEach((p, i) => {
        (PictureSet.heldOutAt(i) ? held : train).push(p);
      });
    const pack = (ps: Picture[]) => {
      const inputs = new Float32Array(ps.length * this.sampleSize);
      for (const [i, p] of ps.entries()) inputs.set(p.pixels, i * this.sampleSize);
      return { inputs, labels: Int32Array.from(ps, (p) => p.label) };
    };
    const { classes } = this.local;
    return new LocalDataset({
      name,
      ...pack(train),
      inputShape: localInputShape(this.local),
      numClasses: classes.length,
      classNames: classes,
      heldOut: pack(held),
    });
  }
}
