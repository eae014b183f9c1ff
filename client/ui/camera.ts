/**
 * The capture panel's camera (capture_panel.ts): the tab's own camera in a preview, what went
 * wrong when there is none or it is refused (in words, with what to do: files still work), and a
 * button held down to take a burst of pictures, as Teachable Machine's "Hold to record". The video
 * stays in the tab: frames are drawn on a canvas here and nowhere else.
 */

/** Pictures a held button takes per second (Teachable Machine takes about as many). */
export const BURST_PER_SECOND = 10;

/** What the person reads when the camera cannot start: why, and what to do instead (files always work). */
export function cameraProblem(err: unknown): string {
  const named = err as { name?: unknown; message?: unknown } | null;
  const name = typeof named?.name === 'string' ? named.name : '';
  const files = 'Add pictures from files instead: each class’s “Add files”, or drop them on the class.';
  switch (name) {
    case 'NotAllowedError':
    case 'SecurityError':
      return `The camera was not allowed in this tab, so it cannot take pictures. ${files} Or allow the camera for this site (the camera icon in the address bar) and press “Turn on the camera” again.`;
    case 'NotFoundError':
    case 'OverconstrainedError':
      return `This computer has no camera the browser can use. ${files}`;
    case 'NotReadableError':
    case 'AbortError':
      return `The camera is busy: another app or tab is using it. Close that and press “Turn on the camera” again. ${files}`;
    case 'NoMediaDevices':
      return `This browser offers no camera on this page (an address other than localhost over plain http has none). ${files} Or open the session over https (the host starts it with npm start -- --https).`;
    default:
      return `The camera did not start (${name || 'error'}: ${typeof named?.message === 'string' ? named.message : String(err)}). ${files}`;
  }
}

/** Starts the tab's camera in `video`; throws what getUserMedia threw (cameraProblem says it in words). */
export async function startCamera(video: HTMLVideoElement): Promise<MediaStream> {
  if (!navigator.mediaDevices?.getUserMedia)
    throw Object.assign(new Error('navigator.mediaDevices is missing'), { name: 'NoMediaDevices' });
  // A small picture is all the session keeps (at most 128 px a side): no need for the camera's largest.
  const stream = await navigator.mediaDevices.getUserMedia({ video: { width: { ideal: 320 }, height: { ideal: 240 } }, audio: false });
  video.srcObject = stream;
  video.muted = true;
  video.playsInline = true;
  await video.play();
  return stream;
}

export function stopCamera(video: HTMLVideoElement, stream: MediaStream | null): void {
  for (const track of stream?.getTracks() ?? []) track.stop();
  video.srcObject = null;
}

/**
 * Makes `button` take pictures while it is held: one at once, then BURST_PER_SECOND a second
 * until it is let go (mouse, touch or pen; Space or Enter held down on the keyboard). `take`
 * returns false to end the burst (a class full, the camera gone).
 */
export function holdToCapture(button: HTMLButtonElement, take: () => boolean): void {
  let timer: ReturnType<typeof setInterval> | undefined;
  const stop = () => {
    if (timer === undefined) return;
    clearInterval(timer);
    timer = undefined;
    button.removeAttribute('aria-pressed');
  };
  const start = () => {
    if (timer !== undefined || button.disabled) return;
    button.setAttribute('aria-pressed', 'true');
    if (!take()) return stop();
    timer = setInterval(() => {
      if (button.disabled || !take()) stop();
    }, 1000 / BURST_PER_SECOND);
  };
  button.addEventListener('pointerdown', (e) => {
    if (e.button !== 0) return;
    // Keeps the burst going when the finger or mouse slides off the button a little.
    button.setPointerCapture?.(e.pointerId);
    start();
  });
  for (const ev of ['pointerup', 'pointercancel', 'lostpointercapture', 'blur'] as const) button.addEventListener(ev, stop);
  button.addEventListener('keydown', (e) => {
    if ((e.key === ' ' || e.key === 'Enter') && !e.repeat) {
      e.preventDefault();
      start();
    }
  });
  button.addEventListener('keyup', (e) => {
    if (e.key === ' ' || e.key === 'Enter') stop();
  });
  // A long press on a phone would open the context menu instead of recording.
  button.addEventListener('contextmenu', (e) => e.preventDefault());
}
