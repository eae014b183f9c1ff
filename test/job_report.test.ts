/** A page's reports as the launcher reads them: checked at the boundary, refused with ReportError naming what is wrong. */
import { describe, expect, it } from 'vitest';
import { parseReport, ReportError } from '../src/jobs/job_report.ts';

const refusal = (raw: unknown): ReportError => {
  try {
    parseReport(raw);
  } catch (err) {
    if (err instanceof ReportError) return err;
    throw err;
  }
  throw new Error(`accepted ${JSON.stringify(raw)}`);
};

describe('parseReport', () => {
  it('takes the four kinds as the pages send them', () => {
    expect(parseReport({ type: 'rank', rank: 1, worldSize: 2 })).toEqual({ type: 'rank', rank: 1, worldSize: 2 });
    const step = { type: 'step', round: 'a.1', rank: 0, step: 3, epoch: 0, totalSteps: 10, metrics: [], elapsedMs: 5 };
    expect(parseReport({ type: 'elastic', event: step })).toEqual({ type: 'elastic', event: step });
    const result = {
      rank: 0,
      worldSize: 2,
      steps: 12,
      weightHash: '0a1b2c3d',
      weights: 'AAAAPw==',
      finalLoss: 0.5,
      commHook: { name: 'none' },
    };
    expect(parseReport({ type: 'result', result })).toEqual({ type: 'result', result });
    expect(parseReport({ type: 'error', name: 'RendezvousClosedError', message: 'the run has ended' })).toEqual({
      type: 'error',
      name: 'RendezvousClosedError',
      message: 'the run has ended',
    });
  });

  it('refuses what is not a report, naming the field', () => {
    expect(refusal(null).message).toBe('a report must be an object with a string type');
    expect(refusal({ type: 'done' }).message).toBe('a report\'s type must be rank, elastic, result or error, got "done"');
    expect(refusal({ type: 'rank', rank: 2, worldSize: 2 }).message).toMatch(/^a 'rank' report needs a rank from 0 to worldSize - 1/);
    expect(refusal({ type: 'rank', rank: 0.5, worldSize: 2 })).toBeInstanceOf(ReportError);
    expect(refusal({ type: 'elastic', event: 'step' }).message).toBe("an 'elastic' report needs an event with a string type");
    expect(refusal({ type: 'elastic', event: { type: 'step', step: -1 } }).message).toBe(
      "the 'step' event's step must be a whole number >= 0, got -1",
    );
    expect(refusal({ type: 'result', result: [1, 2] }).message).toBe("a 'result' report needs its result as an object");
    expect(refusal({ type: 'result', result: { rank: 'zero' } }).message).toBe("a result's rank must be a whole number >= 0, got zero");
    expect(refusal({ type: 'result', result: { weightHash: 'a\nb' } }).message).toMatch(/^a result's weightHash must be a short token/);
    expect(refusal({ type: 'result', result: { weights: '<script>' } }).message).toBe("a result's weights must be base64 text");
    expect(refusal({ type: 'error', name: 'Error' }).message).toBe("an 'error' report needs a string name and message");
  });

  it("cuts an error's text a page can grow", () => {
    const r = parseReport({ type: 'error', name: 'Error', message: 'x'.repeat(10_000) });
    expect(r.type === 'error' && r.message.length).toBeLessThan(4100);
    expect(r.type === 'error' && r.message.endsWith('... (cut)')).toBe(true);
  });
});
