/**
 * The page's side of each tab's own pictures that needs no browser: the dashboard's model of the
 * evaluations on every tab's held-out pictures (the run's events in, the card's rows out) and
 * what the capture panel says when the camera cannot start.
 */
import { describe, expect, it } from 'vitest';
import { initialDashboardState, reduceDashboard, type DashboardState } from '../client/ui/dashboard_state.ts';
import { accuracyText, localFigures } from '../client/ui/dashboard_local.ts';
import { cameraProblem } from '../client/ui/camera.ts';
import type { TrainEvent } from '../client/train/events.ts';

const T0 = Date.UTC(2024, 0, 1, 12, 0, 0);
const acc = (correct: number, count: number) => ({ correct, count, accuracy: count > 0 ? correct / count : null });

function run(events: TrainEvent[]): DashboardState {
  return events.reduce((s, event, i) => reduceDashboard(s, { at: T0 + i, event }), initialDashboardState({ session: 's', at: T0 }));
}

describe('the dashboard on each tab’s own pictures', () => {
  it('shows nothing of it for other datasets', () => {
    expect(localFigures(run([]))).toBeNull();
  });

  it('shows the group’s accuracy, this tab’s and each tab’s pictures and accuracy, with a line in the log', () => {
    const s = run([
      { type: 'joined', rank: 1, worldSize: 3, backend: 'cpu', adapter: null },
      { type: 'local-counts', epoch: 0, step: 0, samples: [12, 0, 30], remaining: [12, 0, 30], left: null },
      { type: 'local-eval', epoch: 0, step: 6, own: acc(0, 0), ranks: [acc(2, 3), acc(0, 0), acc(6, 7)], group: acc(8, 10) },
    ]);
    expect(localFigures(s)).toEqual({
      group: '80.0% (8 of 10)',
      own: 'no test pictures',
      step: 6,
      rows: [
        { rank: 0, self: false, pictures: 12, accuracy: '66.7% (2 of 3)' },
        { rank: 1, self: true, pictures: 0, accuracy: 'no test pictures' },
        { rank: 2, self: false, pictures: 30, accuracy: '85.7% (6 of 7)' },
      ],
    });
    expect(s.log.map((l) => l.message)).toContain('Held-out pictures at step 6: this tab no test pictures, the group 80.0% (8 of 10).');
  });

  it('knows the tabs’ pictures before the first evaluation', () => {
    const s = run([{ type: 'local-counts', epoch: 0, step: 0, samples: [4, 9], remaining: [4, 9], left: null }]);
    expect(localFigures(s)).toMatchObject({ group: 'after the first evaluation', own: '–', step: null });
    expect(localFigures(s)!.rows.map((r) => r.pictures)).toEqual([4, 9]);
    expect(accuracyText(acc(1, 4))).toBe('25.0% (1 of 4)');
  });
});

describe('the camera, when it cannot start', () => {
  it('says why and that files still work, whatever the browser threw', () => {
    const refused = cameraProblem(new DOMException('Permission denied', 'NotAllowedError'));
    expect(refused).toMatch(/^The camera was not allowed in this tab, so it cannot take pictures\. Add pictures from files instead/);
    expect(cameraProblem(Object.assign(new Error('Requested device not found'), { name: 'NotFoundError' }))).toMatch(
      /^This computer has no camera/,
    );
    expect(cameraProblem(Object.assign(new Error('busy'), { name: 'NotReadableError' }))).toMatch(/^The camera is busy/);
    expect(cameraProblem(Object.assign(new Error('no API'), { name: 'NoMediaDevices' }))).toMatch(/npm start -- --https/);
    expect(cameraProblem('odd')).toMatch(/^The camera did not start \(error: odd\)\. Add pictures from files instead/);
  });
});
