/**
 * The dashboard for tabs without a rank (spectators of a full session): rank 0 publishes what its
 * dashboard shows (the run's configuration, shards, steps, evaluations, losses of ranks, the end)
 * to one key of the session's store every few seconds, and spectators read it and feed their
 * own dashboard the events they have not seen. Nothing here is trusted: what a member publishes
 * is checked before a spectator's dashboard sees it.
 */
import type { Store } from '../../src/index.ts';
import { StoreError } from '../../src/index.ts';
import type { TrainEvent } from './events.ts';
import { configParams, parseTrainConfig, urlOption, type TrainConfig } from '../../src/jobs/train_config.ts';
import { parseFleetMembers } from './fleet.ts';

/** The store key rank 0 publishes to. */
export const DASHBOARD_KEY = 'dashboard/replay';
/** Kept well under the store's 1 MiB frame (values travel as base64). */
const MAX_PUBLISHED_BYTES = 512 * 1024;
const PUBLISH_EVERY_MS = 2_000;
const POLL_EVERY_MS = 2_000;
/** The kinds a spectator's dashboard needs; the rest are about the publishing tab itself. */
/** The longest prompt or sampled text a spectator takes (the job samples 120 characters). */
const MAX_SAMPLE_CHARS = 1000;

const SHARED = new Set<TrainEvent['type']>(['config', 'shard', 'step', 'eval', 'sample', 'rank-lost', 'stopped', 'fleet']);

/** Rank 0's side: remembers the shared events and publishes them, at most every few seconds. */
export class DashboardPublisher {
  private events: TrainEvent[] = [];
  private last = 0;
  private writing = false;

  constructor(private readonly store: Store) {}

  /** Every event the page's dashboard gets; `publishing` says whether this tab is rank 0 now. */
  record(e: TrainEvent, publishing: boolean): void {
    if (!SHARED.has(e.type)) return;
    // The group's tabs: only the latest word counts (each says every rank heard so far); and the
    // language model's latest sample is all a dashboard shows (they come ever more rarely, and at evaluations).
    if (e.type === 'fleet' || e.type === 'sample') this.events = this.events.filter((old) => old.type !== e.type);
    this.events.push(e);
    // Steps are the bulk: keep the latest ones within the budget (evaluations and the rest stay).
    if (this.events.length % 50 === 0) this.trim();
    if (publishing && Date.now() - this.last > PUBLISH_EVERY_MS) void this.publish();
  }

  private trim(): void {
    let text = JSON.stringify(this.events);
    while (text.length > MAX_PUBLISHED_BYTES) {
      const firstStep = this.events.findIndex((e) => e.type === 'step');
      if (firstStep < 0) break;
      this.events.splice(firstStep, Math.max(1, Math.floor(this.events.length / 10)));
      text = JSON.stringify(this.events);
    }
  }

  private async publish(): Promise<void> {
    if (this.writing) return;
    this.writing = true;
    this.last = Date.now();
    try {
      this.trim();
      await this.store.set(DASHBOARD_KEY, JSON.stringify({ events: this.events }));
    } catch {
      // A failed publish only leaves spectators a little behind; training must not care.
    } finally {
      this.writing = false;
    }
  }
}

/**
 * A spectator's side: polls the published events until `stop()`, and feeds `handle` the ones
 * newer than what it has shown (by step for steps and evaluations, once for the rest).
 */
export function watchDashboard(store: Store, handle: (e: TrainEvent) => void): { stop(): void } {
  let stopped = false;
  let lastStep = 0;
  let lastEval = -1;
  const seen = new Set<string>();
  const poll = async () => {
    while (!stopped) {
      try {
        const raw = new TextDecoder().decode(await store.get(DASHBOARD_KEY, POLL_EVERY_MS));
        for (const e of parseEvents(raw)) {
          if (stopped) return;
          if (e.type === 'step') {
            if (e.step <= lastStep) continue;
            lastStep = e.step;
          } else if (e.type === 'eval') {
            if (e.step <= lastEval) continue;
            lastEval = e.step;
          } else {
            const key = JSON.stringify(e);
            if (seen.has(key)) continue;
            seen.add(key);
          }
          handle(e);
        }
      } catch (err) {
        // Nothing published yet (a timeout) or a connection gone: try again, unless it is for good.
        if (!(err instanceof StoreError) && !(err instanceof SyntaxError) && !(err instanceof TypeError)) throw err;
      }
      await new Promise((r) => setTimeout(r, POLL_EVERY_MS));
    }
  };
  void poll().catch(() => {});
  return {
    stop: () => {
      stopped = true;
    },
  };
}

const num = (v: unknown) => typeof v === 'number' && Number.isFinite(v);
const int = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const str = (v: unknown, max = 500) => typeof v === 'string' && v.length <= max;

/** The published events that have the shape the dashboard expects; anything else is dropped. */
export function parseEvents(text: string): TrainEvent[] {
  const raw: unknown = JSON.parse(text);
  const list = typeof raw === 'object' && raw !== null ? (raw as { events?: unknown }).events : undefined;
  if (!Array.isArray(list)) throw new TypeError('the published dashboard has no event list');
  const out: TrainEvent[] = [];
  for (const e of list) {
    if (typeof e !== 'object' || e === null) continue;
    const event = e as Record<string, unknown>;
    if (event.type === 'config') {
      // Through the job's own schema, both ways: only a configuration the page could have made passes.
      try {
        const params = configParams(event.config as TrainConfig);
        out.push({ type: 'config', config: parseTrainConfig((name) => urlOption(params, name)) });
      } catch {
        // not a configuration: dropped
      }
    } else if (event.type === 'fleet') {
      // Another tab's words about the group's tabs: checked and cleaned like the store's values.
      const members =
        int(event.worldSize) && (event.worldSize as number) <= 4096 ? parseFleetMembers(event.members, event.worldSize as number) : null;
      if (members) out.push({ type: 'fleet', worldSize: event.worldSize as number, members });
    } else if (isEvent(event)) out.push(event as unknown as TrainEvent);
  }
  return out;
}

function isEvent(e: Record<string, unknown>): boolean {
  switch (e.type) {
    case 'shard':
      return int(e.epoch) && int(e.samples) && int(e.datasetSize) && int(e.stepsPerEpoch);
    case 'step':
      return (
        int(e.epoch) &&
        int(e.step) &&
        int(e.totalSteps) &&
        num(e.elapsedSec) &&
        Array.isArray(e.ranks) &&
        e.ranks.length <= 4096 &&
        e.ranks.every((r: unknown) => {
          const m = r as Record<string, unknown>;
          const b = m?.breakdownMs as Record<string, unknown> | undefined;
          const d = m?.devices as Record<string, unknown> | undefined;
          // --devices: a count of devices and their compute, when there.
          const devicesOk =
            d === undefined || (typeof d === 'object' && d !== null && int(d.count) && (d.count as number) <= 64 && num(d.meanMs));
          // Uneven batches: the rank's samples this step, when the job says.
          const samplesOk = m?.samples === undefined || int(m.samples);
          // Balanced batches: a rank given no samples has no loss or accuracy (null), and its cost and next probe step.
          const i = m?.idle as Record<string, unknown> | undefined;
          const idleOk =
            i === undefined || (typeof i === 'object' && i !== null && num(i.perSampleMs) && num(i.overheadMs) && int(i.probeAt));
          const figure = (v: unknown) => v === null || num(v);
          return (
            typeof m === 'object' &&
            m !== null &&
            samplesOk &&
            idleOk &&
            int(m.rank) &&
            figure(m.loss) &&
            figure(m.accuracy) &&
            num(m.samplesPerSec) &&
            !!b &&
            num(b.compute) &&
            num(b.readback) &&
            num(b.allreduce) &&
            num(b.apply) &&
            devicesOk
          );
        })
      );
    case 'eval':
      return int(e.epoch) && int(e.step) && num(e.testAccuracy) && num(e.testLoss);
    case 'sample':
      // Shown as text, never as markup; bounded like every value a rank publishes.
      return int(e.step) && str(e.prompt, MAX_SAMPLE_CHARS) && str(e.text, MAX_SAMPLE_CHARS);
    case 'rank-lost':
      return int(e.rank) && str(e.reason);
    case 'stopped':
      return int(e.by) && int(e.atStep);
    default:
      return false;
  }
}
