/**
 * The create form's pure parts (client/ui/session_link.ts): its fields come from the job's
 * schema, its defaults follow the fields they depend on, it refuses what the page's URL parser
 * refuses, and the link it makes parses back to the same job.
 */
import { describe, expect, it } from 'vitest';
import { TRAIN_OPTIONS, parseTrainConfig, urlOption } from '../client/train/config.ts';
import { FORM_FIELDS, checkForm, fieldDefaults, formConfig, sessionUrl } from '../client/ui/session_link.ts';
import { newSessionToken, tokenFromFragment } from '../src/session_token.ts';

const TOKEN = newSessionToken();

const ORIGIN = 'http://127.0.0.1:8080/';

/** The form as it first shows, with the session named and these fields changed. */
function form(changes: Record<string, string> = {}): Record<string, string> {
  return { session: 'my-run', ...fieldDefaults({}), ...changes };
}

describe('the create form', () => {
  it('has the session name, then one field per schema option shown in the form', () => {
    expect(FORM_FIELDS.map((f) => f.label)).toEqual(['Session name', ...TRAIN_OPTIONS.filter((o) => o.inForm).map((o) => o.label)]);
    expect(FORM_FIELDS.slice(0, 5).map((f) => f.label)).toEqual(['Session name', 'World size (tabs)', 'Keep training with at least (tabs)', 'Model', 'Dataset']);
    expect(FORM_FIELDS.find((f) => f.name === 'model')!.control).toEqual({ type: 'select', choices: ['mlp', 'cnn'] });
    expect(FORM_FIELDS.find((f) => f.name === 'world')!.control).toEqual({ type: 'number', min: 1, max: 64 });
    expect(FORM_FIELDS.filter((f) => f.optional).map((f) => f.name)).toEqual(['min', 'steps', 'trainSize']);
  });

  it('shows the schema defaults, leaves optional fields empty, and the learning rate follows the optimizer', () => {
    expect(fieldDefaults({})).toEqual({ world: '1', min: '', model: 'mlp', dataset: 'mnist', batchSize: '64', optimizer: 'adam', lr: '0.003', epochs: '1', steps: '', trainSize: '', backend: 'webgpu' });
    expect(fieldDefaults({ optimizer: 'sgd' }).lr).toBe('0.05');
  });

  it('makes the link in the documented order, leaving out what is not set', () => {
    const url = sessionUrl(ORIGIN, form({ world: '3', model: 'mlp', dataset: 'synthetic' }), TOKEN);
    expect(url).toBe(`http://127.0.0.1:8080/?session=my-run&world=3&job=train&model=mlp&dataset=synthetic&batchSize=64&optimizer=adam&lr=0.003&epochs=1&backend=webgpu#token=${TOKEN}`);
    expect(tokenFromFragment(url)).toBe(TOKEN);
  });

  it('a link with every option set parses back to the job the form describes', () => {
    const values = form({ world: ' 4 ', min: '2', optimizer: 'sgd', lr: '1e-2', steps: '100', trainSize: '1536', backend: 'wasm' });
    const url = new URL(sessionUrl(ORIGIN, values, TOKEN));
    expect(url.search).toBe('?session=my-run&world=4&job=train&min=2&model=mlp&dataset=mnist&batchSize=64&optimizer=sgd&lr=0.01&epochs=1&steps=100&trainSize=1536&backend=wasm');
    expect(parseTrainConfig((name) => urlOption(url.searchParams, name))).toEqual(formConfig(values));
    expect(formConfig(values)).toMatchObject({ min: 2, max: 4, lr: 0.01, steps: 100, trainSize: 1536 });
  });

  it('accepts the form as it first shows', () => {
    expect(checkForm(form())).toEqual({});
  });

  it('says what is wrong with each field, in the schema’s words', () => {
    expect(checkForm(form({ session: '' }))).toEqual({ session: 'Session name is required.' });
    expect(checkForm(form({ session: 'a b' }))).toEqual({ session: 'Use only letters, digits, “-”, “_” and “.” (at most 64 characters).' });
    expect(checkForm(form({ world: '0', batchSize: '', lr: 'fast', steps: '2.5' }))).toEqual({
      world: 'World size (tabs) must be an integer from 1 to 64.',
      batchSize: 'Batch size per rank is required.',
      lr: 'Learning rate must be a number above 0 and at most 10.',
      steps: 'Steps must be an integer from 1 to 10000000.',
    });
  });

  it('refuses a minimum above the world size, as the page would', () => {
    expect(checkForm(form({ world: '3', min: '5' }))).toEqual({ min: "Keep training with at least (tabs) must be at most the session's largest size (3)." });
    expect(() => sessionUrl(ORIGIN, form({ world: '3', min: '5' }), TOKEN)).toThrow(/option min/);
  });
});
