/**
 * How the launcher ends on a signal: with the status a shell gives a process the signal killed
 * (128 + its number), so that `npm run launch ...; echo $?` after Ctrl-C says 130.
 */

/** The signals the launcher takes, and the exit status it ends with after each. */
export const SIGNAL_EXIT_CODES = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 } as const;
export type TerminationSignal = keyof typeof SIGNAL_EXIT_CODES;
export const TERMINATION_SIGNALS = Object.keys(SIGNAL_EXIT_CODES) as TerminationSignal[];

/** The exit status after `signal` (1 for a signal the launcher does not take). */
export function signalExitCode(signal: NodeJS.Signals): number {
  return SIGNAL_EXIT_CODES[signal as TerminationSignal] ?? 1;
}

/**
 * For the launcher's command line: once a termination signal has come, the process ends with that
 * signal's status however its teardown ends. Several parts take the signal (Playwright closes its
 * browser, a LAN tears itself down, a headful Chromium or a Firefox kills its group), and the run
 * they interrupt fails meanwhile: without this, whichever finished first chose the status, and a
 * run that noticed its browser closing first ended with 1. With nothing else to take it (before a
 * browser starts), the signal ends the process at once, as it would have without a handler.
 */
export function exitAsSignalled(): void {
  let received: TerminationSignal | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    received ??= signal as TerminationSignal;
    if (process.listenerCount(signal) === 1) process.exit(signalExitCode(signal));
  };
  for (const signal of TERMINATION_SIGNALS) process.on(signal, onSignal);
  // Node reads the status back after the 'exit' listeners, also after process.exit(1) or an
  // uncaught error: the signal's status wins over what the interrupted run ended with.
  process.on('exit', () => {
    if (received) process.exitCode = SIGNAL_EXIT_CODES[received];
  });
}
