/**
 * The capture panel of a session on each tab's own pictures (dataset local): per class, a button
 * held to record a burst from the camera and files chosen or dropped; thumbnails (drawn from the
 * very floats that train) and counts; a picture removed with its ×. It says plainly what leaves
 * the tab and what never does, and resolves `joined()` when the person joins the training with
 * the pictures it holds (none will do: the tab trains with zero samples of its own). While the
 * group trains on them the pictures are fixed (a LocalDataset does not change under a run).
 */
import type { LocalDataConfig } from '../../src/jobs/train_config.ts';
import { MAX_PICTURES_PER_CLASS, PictureSet, PictureSetError, type Picture } from './pictures.ts';
import { cameraProblem, holdToCapture, startCamera, stopCamera } from './camera.ts';
import { el } from './dom.ts';
import { drawInput, fileToInput, PICTURE_ACCEPT, PictureError, resizeToInput } from './picture_resize.ts';
import './styles/base.css';
import './styles/capture.css';

/** What leaves the tab and what never does, in plain words (also docs/class.md). */
export const PRIVACY_TEXT = {
  leaves:
    'What leaves this tab: the model’s gradients at each step (numbers computed from your pictures and averaged with the other tabs’), how many pictures this tab holds, and how many of its test pictures the model gets right.',
  stays: 'What never leaves it: the pictures. They are not uploaded or saved anywhere; closing or reloading this tab deletes them.',
} as const;

interface ClassRow {
  count: HTMLElement;
  hold: HTMLButtonElement;
  files: HTMLInputElement;
  thumbs: HTMLElement;
  items: Map<number, HTMLElement>;
}

export class CapturePanel {
  readonly node: HTMLElement;
  readonly pictures: PictureSet;
  private readonly video = el('video', { class: 'capture-video', 'data-testid': 'camera-preview', muted: true, playsinline: true });
  private readonly cameraButton = el(
    'button',
    { type: 'button', class: 'btn btn-secondary', 'data-testid': 'camera-start' },
    'Turn on the camera',
  );
  private readonly cameraStatus = el('p', { class: 'capture-status', role: 'status', 'data-testid': 'camera-status' });
  private readonly message = el('p', { class: 'capture-message', role: 'alert', 'data-testid': 'capture-message' });
  private readonly joinButton = el('button', { type: 'button', class: 'btn btn-primary', 'data-testid': 'join-training' });
  private readonly joinNote = el('p', { class: 'field-hint', id: 'capture-join-note', 'data-testid': 'join-note' });
  private readonly rows: ClassRow[];
  private stream: MediaStream | null = null;
  private locked = false;
  private join!: () => void;
  private readonly joinedPromise = new Promise<void>((resolve) => (this.join = resolve));

  constructor(
    readonly local: LocalDataConfig,
    session: string,
  ) {
    this.pictures = new PictureSet(local);
    this.rows = local.classes.map((name, label) => this.classRow(name, label));
    this.video.hidden = true;
    this.cameraButton.addEventListener('click', () => void this.toggleCamera());
    this.joinButton.setAttribute('aria-describedby', 'capture-join-note');
    this.joinButton.addEventListener('click', () => this.join());
    const section = el(
      'section',
      { class: 'card capture', 'data-testid': 'capture-panel', 'aria-labelledby': 'capture-title' },
      el(
        'h1',
        { id: 'capture-title', class: 'capture-title' },
        'Your pictures',
        el('span', { class: 'capture-session' }, ` · session ${session}`),
      ),
      el(
        'p',
        { class: 'capture-lede' },
        `Take pictures of each class (${local.classes.join(', ')}) with the camera or from files, then join the training: every tab trains one model on all the tabs’ pictures together.`,
      ),
      el(
        'div',
        { class: 'capture-privacy', 'data-testid': 'privacy' },
        el('p', {}, PRIVACY_TEXT.leaves),
        el('p', {}, el('strong', {}, PRIVACY_TEXT.stays)),
      ),
      el('div', { class: 'capture-camera' }, this.video, el('div', { class: 'capture-camera-side' }, this.cameraButton, this.cameraStatus)),
      this.message,
      el('ol', { class: 'capture-classes' }, ...this.rows.map((r, i) => this.rowNode(r, local.classes[i]!, i))),
      el('div', { class: 'capture-actions' }, this.joinButton, this.joinNote),
    );
    this.node = el('div', { class: 'ddp-ui capture-wrap' }, section);
    this.cameraStatus.textContent = `Hold a class’s “Hold to record” to take about ten pictures a second, or add pictures from files. Each is cut square and shrunk to ${local.imageSize} x ${local.imageSize} px ${local.channels === 1 ? 'grey' : 'colour'} here, in this tab.`;
    this.refresh();
  }

  /** Resolves when the person joins the training with the pictures there are. */
  joined(): Promise<void> {
    return this.joinedPromise;
  }

  /** The group trains on the pictures: they are fixed until the run ends; the camera is turned off. */
  lock(): void {
    this.locked = true;
    stopCamera(this.video, this.stream);
    this.stream = null;
    this.video.hidden = true;
    this.cameraStatus.textContent =
      'Training on the pictures above: they stay in this tab and are fixed while the group trains (a run’s epochs are counted over them).';
    this.refresh();
  }

  private classRow(name: string, label: number): ClassRow {
    const hold = el(
      'button',
      { type: 'button', class: 'btn btn-secondary capture-hold', 'data-testid': `hold-${label}` },
      'Hold to record',
    );
    hold.setAttribute('aria-label', `Hold to record pictures of ${name}`);
    holdToCapture(hold, () => this.takeFromCamera(label));
    const files = el('input', {
      type: 'file',
      multiple: true,
      accept: PICTURE_ACCEPT,
      class: 'visually-hidden',
      'data-testid': `files-${label}`,
      'aria-label': `Add picture files of ${name}`,
    });
    files.addEventListener('change', () => {
      const chosen = [...(files.files ?? [])];
      files.value = '';
      void this.addFiles(label, chosen);
    });
    return {
      count: el('span', { class: 'capture-count', 'data-testid': `count-${label}` }),
      hold,
      files,
      thumbs: el('ul', { class: 'capture-thumbs', 'data-testid': `thumbs-${label}` }),
      items: new Map(),
    };
  }

  private rowNode(row: ClassRow, name: string, label: number): HTMLElement {
    const node = el(
      'li',
      { class: 'capture-class', 'data-testid': `class-${label}` },
      el('div', { class: 'capture-class-head' }, el('h3', {}, name), row.count),
      el(
        'div',
        { class: 'capture-buttons' },
        row.hold,
        el('label', { class: 'btn btn-secondary capture-files' }, 'Add files', row.files),
        el('span', { class: 'field-hint' }, 'or drop pictures here'),
      ),
      row.thumbs,
    );
    node.addEventListener('dragover', (e) => {
      if (this.locked) return;
      e.preventDefault();
      node.classList.add('drop-over');
    });
    node.addEventListener('dragleave', () => node.classList.remove('drop-over'));
    node.addEventListener('drop', (e) => {
      e.preventDefault();
      node.classList.remove('drop-over');
      if (!this.locked) void this.addFiles(label, [...(e.dataTransfer?.files ?? [])]);
    });
    return node;
  }

  private async toggleCamera(): Promise<void> {
    if (this.stream) {
      stopCamera(this.video, this.stream);
      this.stream = null;
      this.video.hidden = true;
      return this.refresh();
    }
    this.cameraButton.disabled = true;
    this.cameraStatus.textContent = 'Starting the camera…';
    try {
      this.stream = await startCamera(this.video);
      this.video.hidden = false;
      this.cameraStatus.textContent = 'Camera on. Hold a class’s “Hold to record” while you show it that class.';
      this.cameraStatus.classList.remove('warn');
    } catch (err) {
      this.cameraStatus.textContent = cameraProblem(err);
      this.cameraStatus.classList.add('warn');
    } finally {
      this.cameraButton.disabled = false;
      this.refresh();
    }
  }

  /** One picture of class `label` from the camera; false ends the burst. */
  private takeFromCamera(label: number): boolean {
    const v = this.video;
    if (this.locked || !this.stream || v.videoWidth === 0) return false;
    return this.addPicture(label, resizeToInput(v, v.videoWidth, v.videoHeight, this.local.imageSize, this.local.channels));
  }

  private async addFiles(label: number, files: File[]): Promise<void> {
    const problems: string[] = [];
    let added = 0;
    for (const file of files) {
      try {
        const pixels = await fileToInput(file, this.local.imageSize, this.local.channels);
        if (!this.addPicture(label, pixels)) break;
        added++;
      } catch (err) {
        if (!(err instanceof PictureError)) throw err;
        problems.push(err.message);
      }
    }
    if (problems.length === 0) return;
    const name = this.local.classes[label]!;
    this.message.textContent = `${added > 0 ? `${added} picture${added === 1 ? '' : 's'} added to ${name}. ` : ''}${problems.join(' ')}`;
  }

  /** Adds a picture and its thumbnail; false (and says why) when the set refuses it. */
  private addPicture(label: number, pixels: Float32Array): boolean {
    // A file still decoding when the person joined: the tab trains on the pictures it had then.
    if (this.locked) return false;
    let picture: Picture;
    try {
      picture = this.pictures.add(label, pixels);
    } catch (err) {
      if (!(err instanceof PictureSetError)) throw err;
      this.message.textContent = err.message;
      return false;
    }
    this.message.textContent = '';
    const row = this.rows[label]!;
    const canvas = el('canvas', { class: 'capture-thumb', 'aria-hidden': 'true' });
    drawInput(canvas, pixels, this.local.imageSize, this.local.channels);
    const remove = el('button', { type: 'button', class: 'capture-remove', title: 'Remove this picture' }, '×');
    remove.addEventListener('click', () => {
      if (this.locked || !this.pictures.remove(picture.id)) return;
      row.items.get(picture.id)?.remove();
      row.items.delete(picture.id);
      this.refresh();
    });
    const item = el('li', { class: 'capture-item' }, canvas, remove);
    row.items.set(picture.id, item);
    row.thumbs.append(item);
    this.refresh();
    return true;
  }

  /** Counts, test marks, remove buttons' names and what may be pressed now. */
  private refresh(): void {
    const counts = this.pictures.counts();
    this.rows.forEach((row, label) => {
      const c = counts[label]!;
      const full = c.pictures >= MAX_PICTURES_PER_CLASS;
      row.count.textContent =
        c.pictures === 0
          ? 'no pictures yet'
          : `${c.pictures} picture${c.pictures === 1 ? '' : 's'}: ${c.pictures - c.heldOut} to train, ${c.heldOut} to test`;
      row.count.parentElement?.parentElement?.setAttribute('data-count', String(c.pictures));
      row.hold.disabled = this.locked || !this.stream || full;
      row.files.disabled = this.locked || full;
      this.pictures.picturesOf(label).forEach((p, i) => {
        const item = row.items.get(p.id);
        if (!item) return;
        const test = PictureSet.heldOutAt(i);
        item.classList.toggle('held-out', test);
        const button = item.querySelector('button')!;
        button.disabled = this.locked;
        button.setAttribute('aria-label', `Remove picture ${i + 1} of ${c.name}${test ? ' (a test picture)' : ''}`);
      });
    });
    this.cameraButton.textContent = this.stream ? 'Turn off the camera' : 'Turn on the camera';
    this.cameraButton.disabled = this.locked;
    const n = this.pictures.size;
    this.joinButton.hidden = this.locked;
    this.joinButton.textContent =
      n === 0 ? 'Join the training with no pictures' : `Join the training with ${n} picture${n === 1 ? '' : 's'}`;
    this.joinNote.textContent = this.locked
      ? ''
      : n === 0
        ? 'A tab without pictures still takes part: it trains with zero samples of its own, and sees the model the others’ pictures train.'
        : 'Every fifth picture of each class is kept apart to test the model (marked “test”). Pictures are fixed once you join.';
  }
}
