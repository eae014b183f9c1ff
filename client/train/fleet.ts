/**
 * The fleet: which browser, backend and device each rank of the group trains on. The step vote
 * carries numbers only, so these short strings travel through the store instead: at each round,
 * every rank sets one small key in its group's store (`fleet/<rank>`, under the group's own
 * prefix) and reads the others' once they are all there. What comes back is untrusted (any tab
 * of the session can write any key): values over MAX_FLEET_VALUE_BYTES are dropped, every
 * string is stripped of control and formatting characters and cut to its length, and the page
 * shows it with textContent only.
 */
import type { Store } from '../../src/index.ts';
import { BACKENDS, type BackendName } from '../../src/jobs/train_config.ts';

/** What a rank says about itself. */
export interface FleetInfo {
  /** "Chrome 156", "Firefox 128". */
  browser: string;
  /** "Android phone", "Linux", or null when unknown. */
  platform: string | null;
  mobile: boolean;
  /** The backend that runs. */
  backend: BackendName;
  /** The WebGPU adapter, the WebGL renderer, or "CPU, 8 threads"; null when unknown. */
  device: string | null;
  /** Why the backend is not the one the job asked for, if it is not. */
  fallback: string | null;
  /** `navigator.deviceMemory` (GB, rounded by the browser), or null where the browser does not say. */
  memoryGB: number | null;
}

export interface FleetMember extends FleetInfo {
  rank: number;
}

/** A rank's value in the store is at most this many bytes; a longer one is ignored. */
export const MAX_FLEET_VALUE_BYTES = 2048;
/** The longest each string may be, in characters, once cleaned. */
export const FLEET_TEXT_LIMITS = { browser: 48, platform: 32, device: 120, fallback: 280 } as const;
/** How long a rank waits for the others' keys before it reads what is there. */
export const FLEET_WAIT_MS = 30_000;

export const fleetKey = (rank: number): string => `fleet/${rank}`;

/**
 * `value` as plain text of at most `max` characters, or null when it is not a string or holds
 * nothing: control and formatting characters (bidi overrides, zero-width joiners) become spaces,
 * runs of spaces one, and a cut string ends with "…".
 */
export function cleanText(value: unknown, max: number): string | null {
  if (typeof value !== 'string') return null;
  // Cut first (generously) so that a huge string costs nothing more than its first characters.
  const text = value
    .slice(0, max * 4)
    .replace(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Co}\p{Cs}]/gu, ' ')
    .replace(/\s+/g, ' ')
    .trim();
  if (text === '') return null;
  const chars = Array.from(text);
  return chars.length <= max
    ? text
    : `${chars
        .slice(0, max - 1)
        .join('')
        .trimEnd()}…`;
}

/** `info` with every field within its limits (this tab's own info goes through it too). */
export function cleanFleetInfo(info: FleetInfo): FleetInfo {
  return {
    browser: cleanText(info.browser, FLEET_TEXT_LIMITS.browser) ?? 'unknown browser',
    platform: cleanText(info.platform, FLEET_TEXT_LIMITS.platform),
    mobile: info.mobile === true,
    backend: info.backend,
    device: cleanText(info.device, FLEET_TEXT_LIMITS.device),
    fallback: cleanText(info.fallback, FLEET_TEXT_LIMITS.fallback),
    memoryGB:
      typeof info.memoryGB === 'number' && Number.isFinite(info.memoryGB) && info.memoryGB > 0 && info.memoryGB <= 65_536
        ? info.memoryGB
        : null,
  };
}

export function encodeFleetInfo(info: FleetInfo): string {
  return JSON.stringify(cleanFleetInfo(info));
}

/** A value read from the store, checked; null when it is not a rank's fleet info. */
export function parseFleetInfo(value: Uint8Array | string): FleetInfo | null {
  const bytes = typeof value === 'string' ? value.length : value.byteLength;
  if (bytes > MAX_FLEET_VALUE_BYTES) return null;
  let raw: unknown;
  try {
    raw = JSON.parse(typeof value === 'string' ? value : new TextDecoder().decode(value));
  } catch {
    return null;
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return null;
  const o = raw as Record<string, unknown>;
  if (typeof o.backend !== 'string' || !(BACKENDS as readonly string[]).includes(o.backend)) return null;
  return cleanFleetInfo({
    browser: typeof o.browser === 'string' ? o.browser : '',
    platform: typeof o.platform === 'string' ? o.platform : null,
    mobile: o.mobile === true,
    backend: o.backend as BackendName,
    device: typeof o.device === 'string' ? o.device : null,
    fallback: typeof o.fallback === 'string' ? o.fallback : null,
    memoryGB: typeof o.memoryGB === 'number' ? o.memoryGB : null,
  });
}

/** A fleet event's members, checked (spectators get them from another tab): null when malformed. */
export function parseFleetMembers(value: unknown, worldSize: number): FleetMember[] | null {
  if (!Array.isArray(value) || value.length > worldSize) return null;
  const out: FleetMember[] = [];
  for (const m of value) {
    if (typeof m !== 'object' || m === null) return null;
    const rank = (m as { rank?: unknown }).rank;
    if (typeof rank !== 'number' || !Number.isSafeInteger(rank) || rank < 0 || rank >= worldSize) return null;
    if (out.some((o) => o.rank === rank)) return null;
    const info = parseFleetInfo(JSON.stringify(m));
    if (!info) return null;
    out.push({ rank, ...info });
  }
  return out.sort((a, b) => a.rank - b.rank);
}

export interface FleetEvent {
  type: 'fleet';
  worldSize: number;
  /** The ranks heard from so far in this round, by rank; a later event of the round has them all. */
  members: FleetMember[];
}

/** The part of a process group the fleet needs. */
export interface FleetGroup {
  rank: number;
  worldSize: number;
  /** The group's own store (keys under the group's prefix). */
  store: Store;
}

/**
 * Shares this tab's info at every round and reports the group's. One per run: it removes its
 * key of the previous round (so that an elastic session's rounds do not pile keys up in the
 * store), and drops what it reads for a round that is over.
 */
export class FleetSharer {
  private round = 0;
  private previous: { store: Store; rank: number } | null = null;

  constructor(private readonly waitMs = FLEET_WAIT_MS) {}

  /** Resolves once the group's fleet is told (or given up on); never rejects. */
  async share(group: FleetGroup, info: FleetInfo, emit: (e: FleetEvent) => void): Promise<void> {
    const round = ++this.round;
    const mine: FleetMember = { rank: group.rank, ...cleanFleetInfo(info) };
    const current = () => round === this.round;
    emit({ type: 'fleet', worldSize: group.worldSize, members: [mine] });
    const before = this.previous;
    this.previous = { store: group.store, rank: group.rank };
    try {
      await group.store.set(fleetKey(group.rank), encodeFleetInfo(info));
    } catch {
      return; // the group is gone already; the next round shares again
    }
    if (before) before.store.deleteKey(fleetKey(before.rank)).catch(() => {});
    if (group.worldSize === 1 || !current()) return;
    const keys = Array.from({ length: group.worldSize }, (_, r) => fleetKey(r));
    let present = keys;
    try {
      // One blocking call per round, however many ranks: every rank writes its key as the round starts.
      await group.store.wait(keys, this.waitMs);
    } catch {
      if (!current()) return;
      // Some rank never said (an older page, or one that left): read those that did.
      present = [];
      for (const key of keys) {
        if (await group.store.check([key]).catch(() => false)) present.push(key);
      }
    }
    if (!current() || present.length === 0) return;
    let values: Array<Uint8Array | null>;
    try {
      values = await group.store.multiGet(present, this.waitMs);
    } catch {
      if (!current()) return;
      // One value too large for a reply (a hostile tab's) must not hide the others': one key at a time.
      values = await Promise.all(present.map((key) => group.store.get(key, this.waitMs).catch(() => null)));
    }
    if (!current()) return;
    const members = new Map<number, FleetMember>([[mine.rank, mine]]);
    present.forEach((key, i) => {
      const rank = Number(key.slice('fleet/'.length));
      if (rank === mine.rank) return;
      const value = values[i];
      const theirs = value ? parseFleetInfo(value) : null;
      if (theirs) members.set(rank, { rank, ...theirs });
    });
    emit({ type: 'fleet', worldSize: group.worldSize, members: [...members.values()].sort((a, b) => a.rank - b.rank) });
  }
}

/**
 * The device column: the WebGPU adapter on webgpu, the WebGL renderer on webgl, the CPU's
 * threads on wasm and cpu (a WebGPU adapter the tab does not train on says nothing about it).
 */
export function deviceText(
  backend: BackendName,
  adapter: string | null,
  glRenderer: string | null,
  cpuThreads: number | null,
): string | null {
  const threads = cpuThreads !== null && Number.isSafeInteger(cpuThreads) && cpuThreads > 0 ? `CPU, ${cpuThreads} threads` : 'CPU';
  switch (backend) {
    case 'webgpu':
      return adapter;
    case 'webgl':
      // "ANGLE (Google, Vulkan 1.3.0 (SwiftShader Device ...), SwiftShader driver)": the part in the brackets says it.
      return glRenderer === null ? null : glRenderer.replace(/^ANGLE \((.*)\)$/s, '$1');
    case 'wasm':
    case 'cpu':
      return threads;
  }
}
