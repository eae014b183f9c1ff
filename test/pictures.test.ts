/**
 * A tab's own pictures (dataset local) before they train: the square cut and the pixel
 * conversions the capture panel resizes with (the canvas itself is the e2e's), the set of
 * pictures per class with its refusals, and the LocalDataset it becomes, 1 in 5 of each class
 * held out.
 */
import { describe, expect, it } from 'vitest';
import { inputToRgba, PictureError, rgbaToInput, squareCrop } from '../client/ui/picture_resize.ts';
import { HOLD_OUT_EVERY, MAX_PICTURES_PER_CLASS, PictureSet, PictureSetError } from '../client/ui/pictures.ts';
import { errorOf } from './fixtures/errors.ts';

describe('resizing a picture in its tab', () => {
  it('cuts the largest centred square of a landscape, a portrait and a square picture', () => {
    expect(squareCrop(640, 480)).toEqual({ sx: 80, sy: 0, side: 480 });
    expect(squareCrop(480, 641)).toEqual({ sx: 0, sy: 80, side: 480 });
    expect(squareCrop(32, 32)).toEqual({ sx: 0, sy: 0, side: 32 });
    expect(() => squareCrop(0, 480)).toThrow(errorOf(PictureError, 'a picture of 0 x 480 pixels has nothing to cut'));
  });

  it('reads RGBA bytes as floats in 0..1: RGB, or grey by luminance as the host’s images', () => {
    const rgba = new Uint8ClampedArray([255, 0, 0, 255, 0, 255, 0, 128, 0, 0, 255, 0, 51, 102, 204, 255]);
    expect(Array.from(rgbaToInput(rgba, 2, 3))).toEqual([1, 0, 0, 0, 1, 0, 0, 0, 1, 0.2, 0.4, 0.8].map(Math.fround));
    const grey = rgbaToInput(rgba, 2, 1);
    expect(grey[0]).toBeCloseTo(0.299, 6);
    expect(grey[1]).toBeCloseTo(0.587, 6);
    expect(grey[2]).toBeCloseTo(0.114, 6);
    expect(grey[3]).toBeCloseTo((0.299 * 51 + 0.587 * 102 + 0.114 * 204) / 255, 6);
    expect(() => rgbaToInput(rgba, 3, 3)).toThrow(errorOf(PictureError, '16 RGBA bytes for a 3 x 3 picture, expected 36'));
  });

  it('draws the input back as the thumbnail shows it: what trains is what the tab sees', () => {
    const rgba = new Uint8ClampedArray([10, 20, 30, 255, 200, 100, 0, 255, 0, 0, 0, 255, 255, 255, 255, 255]);
    expect(Array.from(inputToRgba(rgbaToInput(rgba, 2, 3), 2, 3))).toEqual(Array.from(rgba));
    const grey = inputToRgba(rgbaToInput(rgba, 2, 1), 2, 1);
    expect(grey[0]).toBe(grey[1]);
    expect(grey[3]).toBe(255);
  });
});

describe('a tab’s pictures per class', () => {
  const local = { classes: ['rock', 'paper', 'scissors'], imageSize: 2, channels: 3 as const };
  const picture = (v: number) => new Float32Array(12).fill(v);

  it('counts pictures per class, holds out every fifth of each, and removes by id', () => {
    const set = new PictureSet(local);
    const ids = Array.from({ length: 11 }, (_, i) => set.add(0, picture(i / 10)).id);
    set.add(1, picture(0.5));
    expect(set.counts()).toEqual([
      { name: 'rock', pictures: 11, heldOut: 2 },
      { name: 'paper', pictures: 1, heldOut: 0 },
      { name: 'scissors', pictures: 0, heldOut: 0 },
    ]);
    expect(HOLD_OUT_EVERY).toBe(5);
    expect(set.remove(ids[0]!)).toBe(true);
    expect(set.remove(ids[0]!)).toBe(false);
    expect(set.counts()[0]).toEqual({ name: 'rock', pictures: 10, heldOut: 2 });
    expect(set.size).toBe(11);
  });

  it('becomes the LocalDataset the tab trains on, its held-out pictures apart', () => {
    const set = new PictureSet(local);
    for (let i = 0; i < 6; i++) set.add(0, picture(i));
    for (let i = 0; i < 5; i++) set.add(2, picture(10 + i));
    const data = set.toDataset('mine');
    expect(data.length).toBe(9);
    expect(data.inputShape).toEqual([2, 2, 3]);
    expect(data.numClasses).toBe(3);
    expect(data.countsPerClass()).toEqual([5, 0, 4]);
    // The 5th of each class (values 4 and 14) is held out; none of them trains.
    expect(data.heldOut!.length).toBe(2);
    const held = data.heldOut!.batch([0, 1]);
    expect([held.x[0], held.x[12]]).toEqual([4, 14]);
    expect(Array.from(held.y)).toEqual([0, 2]);
    const { x } = data.batch(Array.from({ length: 9 }, (_, i) => i));
    expect(Array.from({ length: 9 }, (_, i) => x[i * 12])).toEqual([0, 1, 2, 3, 5, 10, 11, 12, 13]);
    // A tab with no pictures still joins: an empty set trains with zero samples.
    const none = new PictureSet(local).toDataset('none');
    expect([none.length, none.heldOut!.length]).toEqual([0, 0]);
  });

  it('refuses a class the session does not have, a picture of the wrong size, and a class past its bound', () => {
    const set = new PictureSet(local);
    expect(() => set.add(3, picture(0))).toThrow(
      errorOf(PictureSetError, "class 3 is not one of this session's 3 classes (rock, paper, scissors): the picture was not added"),
    );
    expect(() => set.add(0, new Float32Array(4))).toThrow(
      errorOf(PictureSetError, "a picture of 4 values, expected 12 (2 x 2 x 3): resize it to the session's size first"),
    );
    for (let i = 0; i < MAX_PICTURES_PER_CLASS; i++) set.add(1, picture(0));
    expect(() => set.add(1, picture(0))).toThrow(errorOf(PictureSetError, /“paper” has 500 pictures already/));
    expect(set.size).toBe(MAX_PICTURES_PER_CLASS);
  });
});
