import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { SIGNAL_EXIT_CODES, signalExitCode } from '../launcher/signals.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** Starts test/fixtures/signalled.ts, sends `signal` once it is ready, resolves with its exit status. */
function statusAfter(how: string, signal: NodeJS.Signals): Promise<{ code: number | null; ms: number; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/signalled.ts', how], { cwd: ROOT });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve, reject) => {
    let sentAt = 0;
    const bound = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the ${how} case did not exit within 20 s of ${signal} (stderr: ${stderr})`));
    }, 20_000);
    child.stdout.on('data', (d: Buffer) => {
      if (sentAt === 0 && d.toString().includes('ready')) {
        sentAt = Date.now();
        child.kill(signal);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(bound);
      resolve({ code, ms: Date.now() - sentAt, stderr });
    });
  });
}

describe('the launcher on a signal (launcher/signals.ts)', () => {
  it("ends with 128 + the signal's number however the interrupted run ends", async () => {
    const [alone, runFails, throws, ends] = await Promise.all([
      statusAfter('alone', 'SIGINT'),
      statusAfter('run-fails', 'SIGTERM'),
      statusAfter('throws', 'SIGINT'),
      statusAfter('ends', 'SIGINT'),
    ]);
    // Nothing else takes it: the signal ends the process at once, as without a handler.
    expect(alone.code, alone.stderr).toBe(130);
    expect(alone.ms).toBeLessThan(5_000);
    // Another part took it and the run failed (exit 1), threw, or drained with exitCode 1.
    expect(runFails.code, runFails.stderr).toBe(143);
    expect(throws.code, throws.stderr).toBe(130);
    expect(throws.stderr).toContain('a page closed under a pending call');
    expect(ends.code, ends.stderr).toBe(130);
  });

  it('maps each signal it takes to its status, and any other to 1', () => {
    expect(SIGNAL_EXIT_CODES).toEqual({ SIGINT: 130, SIGTERM: 143, SIGHUP: 129 });
    expect(signalExitCode('SIGHUP')).toBe(129);
    expect(signalExitCode('SIGUSR1')).toBe(1);
  });
});
