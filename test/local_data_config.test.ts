/**
 * "Each tab's own pictures" (dataset local) in the job's schema: the classes, the pictures' size
 * and colour the host sets, each bad value refused with what to type instead, by the link's
 * parser and by the create form alike; the link the form makes parses back to the same job.
 */
import { describe, expect, it } from 'vitest';
import { configParams, parseTrainConfig, urlOption } from '../src/jobs/train_config.ts';
import { checkForm, fieldApplies, fieldDefaults, formConfig, sessionUrl } from '../client/ui/session_link.ts';
import { readLink } from '../client/ui/link_check.ts';
import { trainJobProblem } from '../launcher/job_flags.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { parse, refusal } from './fixtures/train_config.ts';

const form = (changes: Record<string, string>) => {
  const first = { session: 'class-1', ...fieldDefaults({}), ...changes };
  // The fields that follow their defaults take them, as the form refills them after a change.
  return { ...first, ...fieldDefaults(first), ...changes };
};

describe('dataset local: the classes, size and colour of each tab’s own pictures', () => {
  it('defaults to two classes of 32 px colour pictures; names are trimmed and may be in any script', () => {
    expect(parse('world=3&dataset=local').local).toEqual({ classes: ['Class 1', 'Class 2'], imageSize: 32, channels: 3 });
    const c = parse(
      `world=3&dataset=local&model=cnn&classes=${encodeURIComponent(' chat , chien ,Öl_3,  l’été ')}&imageSize=64&color=gray`,
    );
    expect(c.local).toEqual({ classes: ['chat', 'chien', 'Öl_3', 'l’été'], imageSize: 64, channels: 1 });
    // Every other dataset has none.
    expect(parse('world=3&dataset=synthetic').local).toBeNull();
  });

  it('refuses a wrong number of classes, an empty name, a repeated one, a long one and a stray character, saying which', () => {
    const rule = (q: string) => refusal(`world=2&dataset=local&classes=${encodeURIComponent(q)}`);
    expect(rule('cat').option).toBe('classes');
    expect(rule('cat').rule).toMatch(/^2 to 10 class names separated by commas.*; this has 1 name$/);
    expect(rule('a,b,c,d,e,f,g,h,i,j,k').rule).toMatch(/this has 11 names$/);
    expect(rule('cat,,dog').rule).toMatch(/name 2 is empty/);
    expect(rule('cat,dog,').rule).toMatch(/name 3 is empty/);
    expect(rule('Cat,dog,cat').rule).toMatch(/"cat" is there twice \(names 1 and 3\)/);
    expect(rule(`cat,${'x'.repeat(25)}`).rule).toMatch(/is 25 characters long/);
    expect(rule('cat,<b>dog</b>').rule).toMatch(/"<b>dog<\/b>" has a character that is not allowed/);
    expect(rule('cat,-dog').rule).toMatch(/"-dog" has a character/);
    expect(refusal('world=2&dataset=local&classes=a%0Ab').rule).toMatch(/^2 to 10 class names/);
  });

  it('refuses a size or colour out of range, and all three without dataset local', () => {
    expect(refusal('world=2&dataset=local&imageSize=4')).toMatchObject({ option: 'imageSize', rule: 'an integer from 8 to 128' });
    expect(refusal('world=2&dataset=local&imageSize=256').option).toBe('imageSize');
    expect(refusal('world=2&dataset=local&imageSize=32px').option).toBe('imageSize');
    expect(refusal('world=2&dataset=local&color=blue')).toMatchObject({ option: 'color', rule: 'one of rgb, gray' });
    for (const q of ['classes=a,b', 'imageSize=32', 'color=gray'])
      expect(refusal(`world=2&dataset=mnist&${q}`).rule).toMatch(/^left out unless the dataset is local/);
  });

  it('trains only where the DDP runner takes each tab’s own samples: the built-in image models, DDP, whole', () => {
    expect(refusal('world=2&dataset=local&model=lm').option).toBe('dataset');
    expect(refusal('world=2&dataset=local&model=user').rule).toMatch(/^mlp or cnn with dataset local/);
    expect(refusal('world=2&dataset=local&strategy=ps').rule).toMatch(/^ddp without pipeline stages/);
    expect(refusal('world=2&dataset=local&pp=2&dp=1').option).toBe('pp');
    expect(refusal('world=2&dataset=local&balance=true').rule).toMatch(/split by the pictures each tab has left/);
    expect(parse('world=2&dataset=local').balance).toBe(false);
    expect(refusal('world=2&dataset=local&trainSize=100').rule).toMatch(/each tab trains on all of its own pictures/);
    expect(refusal('world=2&dataset=local&testSize=10').rule).toMatch(/held-out pictures/);
  });

  it('round-trips through a link', () => {
    const c = parse(`world=3&dataset=local&classes=${encodeURIComponent('rock,paper,scissors')}&imageSize=48&color=gray`);
    const again = parseTrainConfig((name) => urlOption(configParams(c), name));
    expect(again).toEqual(c);
  });

  it('the launcher refuses it: its headless tabs hold no pictures and nobody presses their Join', () => {
    expect(trainJobProblem({ dataset: 'local' }, 2)).toMatch(/^--dataset local: each tab's own pictures are taken by people in their tabs/);
    expect(trainJobProblem({ dataset: 'local', classes: 'x' }, 2)).toMatch(/^--classes x: the train job takes 2 to 10 class names/);
  });

  it('a bad link says which option is wrong before the tab joins anything', () => {
    const r = readLink(new URLSearchParams('session=s&job=train&world=3&dataset=local&classes=solo'), []);
    expect(r.kind).toBe('bad');
    if (r.kind !== 'bad') return;
    expect(r.problem.field).toBe('classes');
    expect(r.problem.message).toMatch(/this has 1 name/);
  });
});

describe('the create form with each tab’s own pictures', () => {
  it('shows the classes, size and colour only for dataset local, with Teachable Machine’s two classes to start', () => {
    expect(fieldApplies('classes', form({}))).toBe(false);
    expect(fieldApplies('batchSize', form({}))).toBe(true);
    const local = form({ dataset: 'local' });
    expect(fieldApplies('classes', local)).toBe(true);
    expect(local).toMatchObject({ classes: 'Class 1,Class 2', imageSize: '32', color: 'rgb' });
    expect(checkForm(local)).toEqual({});
  });

  it('says what is wrong with the classes and the size on their own fields', () => {
    expect(checkForm(form({ dataset: 'local', classes: 'cat' }))).toEqual({
      classes: expect.stringMatching(/^Classes must be 2 to 10 class names separated by commas.*this has 1 name\.$/),
    });
    expect(checkForm(form({ dataset: 'local', classes: 'cat,Cat' })).classes).toMatch(/"Cat" is there twice/);
    expect(checkForm(form({ dataset: 'local', imageSize: '300' }))).toEqual({
      imageSize: 'Picture size (px) must be an integer from 8 to 128.',
    });
    expect(checkForm(form({ dataset: 'local', classes: '' })).classes).toBe('Classes is required.');
    expect(checkForm(form({ dataset: 'local', trainSize: '50' })).trainSize).toMatch(/all of its own pictures/);
  });

  it('ignores the hidden fields’ leftovers once another dataset is chosen, and links the classes it shows', () => {
    const back = form({ dataset: 'mnist', classes: 'cat' });
    expect(checkForm(back)).toEqual({});
    expect(formConfig(back).local).toBeNull();
    const token = newSessionToken();
    const url = new URL(sessionUrl('http://127.0.0.1:8080', form({ dataset: 'local', classes: 'rock, paper,scissors' }), token));
    expect(url.searchParams.get('classes')).toBe('rock,paper,scissors');
    expect(url.searchParams.get('imageSize')).toBe('32');
    expect(url.searchParams.get('color')).toBe('rgb');
    expect(parseTrainConfig((n) => urlOption(url.searchParams, n)).local!.classes).toEqual(['rock', 'paper', 'scissors']);
  });
});
