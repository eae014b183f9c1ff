/**
 * A Firefox rank's process group (firefox.ts): the browser, its content processes and, under
 * xvfb-run, its Xvfb, started in a group of their own so that they go together. Ends the group on
 * kill(), when its leader exits, and at the launcher's own exit or signal; finds the WebDriver
 * BiDi address Firefox prints.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { signalExitCode, TERMINATION_SIGNALS } from './signals.ts';

export class FirefoxProcessGroup {
  private readonly child: ChildProcess;
  private exitedFlag = false;
  private killed = false;
  private output = '';
  private hardKill: ReturnType<typeof setTimeout> | undefined;
  /** The WebDriver BiDi address Firefox printed; rejects when it could not start or exited first. */
  readonly listening: Promise<string>;
  private readonly onProcessExit = () => this.killNow();
  private readonly onSignal = (signal: NodeJS.Signals) => {
    this.killNow();
    process.exit(signalExitCode(signal));
  };

  constructor(
    command: string,
    args: string[],
    env: NodeJS.ProcessEnv,
    private readonly executable: string,
    private readonly profileDir: string,
    private readonly onExit?: (how: string) => void,
  ) {
    // Its own process group: the browser, its content processes (and Xvfb) go together.
    this.child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env });
    process.once('exit', this.onProcessExit);
    for (const signal of TERMINATION_SIGNALS) process.once(signal, this.onSignal);
    this.listening = this.scanForAddress(command);
    this.child.once('exit', (code, signal) => this.leaderExited(code, signal));
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** The whole group is gone. */
  exited(): boolean {
    return this.exitedFlag && !this.groupAlive();
  }

  /** SIGTERM first, so that xvfb-run stops its Xvfb and removes its lock; SIGKILL for what is left. */
  kill(): void {
    if (!this.killed && !this.exitedFlag) {
      this.signalGroup('SIGTERM');
      this.hardKill = setTimeout(() => this.signalGroup('SIGKILL'), 2000);
      this.hardKill.unref();
    }
    this.killed = true;
    rmSync(this.profileDir, { recursive: true, force: true });
  }

  /**
   * At the launcher's own exit (Ctrl-C, an uncaught error) there is no later: SIGTERM, up to 1 s
   * (waited synchronously) for Xvfb to remove its lock, then SIGKILL.
   */
  private killNow(): void {
    if (!this.exitedFlag || this.groupAlive()) {
      this.signalGroup('SIGTERM');
      const pause = new Int32Array(new SharedArrayBuffer(4));
      for (let i = 0; i < 20 && this.groupAlive(); i++) Atomics.wait(pause, 0, 0, 50);
      this.signalGroup('SIGKILL');
    }
    this.killed = true;
    rmSync(this.profileDir, { recursive: true, force: true });
  }

  private signalGroup(signal: NodeJS.Signals | 0): void {
    try {
      process.kill(-this.child.pid!, signal);
    } catch {
      /* already gone */
    }
  }

  private groupAlive(): boolean {
    try {
      process.kill(-this.child.pid!, 0);
      return true;
    } catch {
      return false;
    }
  }

  private unhook(): void {
    process.removeListener('exit', this.onProcessExit);
    for (const signal of TERMINATION_SIGNALS) process.removeListener(signal, this.onSignal);
  }

  /** Firefox prints "WebDriver BiDi listening on ws://127.0.0.1:PORT" once its agent is up. */
  private scanForAddress(command: string): Promise<string> {
    const executable = this.executable;
    return new Promise<string>((resolve, reject) => {
      const scan = (d: Buffer) => {
        this.output = (this.output + d.toString()).slice(-20_000);
        const m = /WebDriver BiDi listening on (ws:\/\/[^\s]+)/.exec(this.output);
        if (m) resolve(m[1]!);
      };
      this.child.stdout!.on('data', scan);
      this.child.stderr!.on('data', scan);
      this.child.once('error', (err) =>
        reject(
          new Error(
            `could not start ${command === 'xvfb-run' ? `xvfb-run ${executable} (is xvfb installed? apt-get install -y xvfb)` : executable}: ${err.message}`,
          ),
        ),
      );
      this.child.once('exit', (code, signal) =>
        reject(
          new Error(
            `${executable} exited (${signal ?? `code ${code}`}) before its WebDriver BiDi agent listened: ${this.output.trim().split('\n').slice(-5).join(' | ')}`,
          ),
        ),
      );
    });
  }

  private leaderExited(code: number | null, signal: NodeJS.Signals | null): void {
    this.exitedFlag = true;
    // Whatever of the group outlives its leader (xvfb-run) goes too: SIGTERM now (Xvfb removes its
    // lock), SIGKILL 2 s after the first SIGTERM (the timer kill() set, or this one).
    if (!this.killed) {
      this.signalGroup('SIGTERM');
      this.hardKill = setTimeout(() => this.signalGroup('SIGKILL'), 2000);
      this.hardKill.unref();
    }
    // The launcher's exit and signals still end the rest until the whole group is gone.
    const gone = setInterval(() => {
      if (this.groupAlive()) return;
      clearInterval(gone);
      this.unhook();
    }, 100);
    gone.unref();
    rmSync(this.profileDir, { recursive: true, force: true });
    if (!this.killed) this.onExit?.(signal ? `Firefox was killed (${signal})` : `Firefox exited with code ${code}`);
  }
}
