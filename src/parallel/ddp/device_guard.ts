/**
 * runElastic's watch over this tab's WebGPU device: what the run is doing (for the error), work
 * that fails at once with DeviceLostError when the device goes (a step on a lost device may fail
 * late with a cryptic error, or not settle at all), and whether an error stands for a lost device.
 */
import { watchDevice, type DeviceLostInfo, type DeviceWatch } from '../../runtime/device.ts';
import { DeviceLostError } from '../../wire/errors.ts';

export class DeviceGuard {
  /** What the run is doing, in words, for a DeviceLostError. */
  activity = 'joining the group';
  /** This rank in the current round (-1 before the first). */
  rank = -1;
  /** The device of the running backend (a watch that never fires on backends without one). */
  private device: DeviceWatch = watchDevice();

  /** `rebuilds`: the run rebuilds its state after a loss (the error's advice says so). */
  constructor(private readonly rebuilds: boolean) {}

  /** Stops watching (the run is over, or the backend is about to be re-created). */
  stop(): void {
    this.device.stop();
  }

  /** Watches the device of the backend just re-created. */
  watchAgain(): void {
    this.device = watchDevice();
  }

  isLost(): boolean {
    return this.device.isLost();
  }

  /** The DeviceLostError that `err` stands for when this rank's device is lost; undefined when it is not. */
  async lossOf(err: unknown): Promise<DeviceLostError | undefined> {
    if (err instanceof DeviceLostError) return err;
    const device = this.device;
    // A readback can fail (mapAsync's AbortError) before `device.lost` resolves: give the loss a moment to show.
    if (!device.isLost() && device.backend === 'webgpu' && looksLikeDeviceLoss(err)) await Promise.race([device.lost, sleep(1000)]);
    return device.info ? this.lostError(device.info, err) : undefined;
  }

  private lostError(info: DeviceLostInfo, cause?: unknown): DeviceLostError {
    const advice = this.rebuilds ? 'This rank re-creates its backend, rebuilds its state and rejoins the group.' : undefined;
    return new DeviceLostError(this.rank, info.reason, info.message, this.activity, advice, cause === undefined ? undefined : { cause });
  }

  /** Fails with DeviceLostError if the device is lost already: work started on it now could never finish. */
  throwIfLost(): void {
    if (this.device.info) throw this.lostError(this.device.info);
  }

  /**
   * `work`, unless the device is lost first: then DeviceLostError at once, whatever `work` does
   * (a step on a lost device may fail late with a cryptic error, or not settle at all).
   */
  whileLives<T>(work: T | Promise<T>): Promise<T> {
    const p = Promise.resolve(work);
    const device = this.device;
    return new Promise<T>((resolve, reject) => {
      const off = device.onLost((info) => {
        p.catch(() => {}); // what the abandoned work does next no longer matters
        reject(this.lostError(info));
      });
      p.then(
        (v) => {
          off();
          resolve(v);
        },
        (e: unknown) => {
          off();
          reject(e);
        },
      );
    });
  }
}

/** An error a WebGPU readback or submission gives once its device is lost. */
function looksLikeDeviceLoss(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  return err.name === 'AbortError' || err.name === 'OperationError' || /device (was |is )?lost|mapAsync|GPUDevice/i.test(err.message);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
