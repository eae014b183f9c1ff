/**
 * A port of PyTorch's `torch.utils.data.distributed.DistributedSampler`, bit-exact:
 * for the same dataset length, num_replicas, rank, shuffle, seed, drop_last and epoch,
 * `new DistributedSampler(len, opts).indices()` equals `list(iter(DistributedSampler(...)))`.
 *
 * Exactness rests on three pieces, each mirroring PyTorch's source:
 *  - `Mt19937`: at::mt19937 (aten/src/ATen/core/MT19937RNGEngine.h), the engine behind
 *    torch's CPU generator (aten/src/ATen/CPUGeneratorImpl.cpp).
 *  - `randperm`: randperm_cpu in aten/src/ATen/native/TensorFactories.cpp.
 *  - `DistributedSampler`: torch/utils/data/distributed.py (padding, truncation, striding).
 */

const MT_N = 624;
const MT_M = 397;
const MATRIX_A = 0x9908b0df;
const UPPER_MASK = 0x80000000;
const LOWER_MASK = 0x7fffffff;
const TWO_POW_32 = 0x1_0000_0000;

/**
 * MT19937 (32-bit Mersenne Twister), the same sequence as at::mt19937 / std::mt19937.
 *
 * Seeding mirrors `torch.Generator().manual_seed(seed)`: torch's Python binding turns the
 * int into a uint64 (negative seeds by two's complement), CPUGeneratorImpl::set_current_seed
 * builds `mt19937(seed)`, and mt19937_engine::init_with_uint32 keeps `seed & 0xffffffff` and
 * runs the usual init_genrand recurrence. So only the low 32 bits matter: seeds that agree
 * mod 2^32 give the same stream, as they do in torch.
 */
export class Mt19937 {
  private readonly state = new Uint32Array(MT_N);
  private index = MT_N;

  /** @param seed any safe integer; only its value mod 2^32 is used (see class comment). */
  constructor(seed: number = 5489) {
    this.seed(seed);
  }

  /** Re-seeds in place, like `generator.manual_seed(seed)`. */
  seed(seed: number): void {
    checkSafeInteger('seed', seed);
    const mt = this.state;
    mt[0] = low32(seed);
    for (let i = 1; i < MT_N; i++) {
      const prev = mt[i - 1]!;
      // Math.imul keeps the product exact mod 2^32; the Uint32Array store wraps the sum.
      mt[i] = Math.imul(1812433253, prev ^ (prev >>> 30)) + i;
    }
    // Forces a twist before the first output, like torch's `left_ = 1`.
    this.index = MT_N;
  }

  /** Next 32-bit output, as an integer in [0, 2^32). Equals CPUGeneratorImpl::random(). */
  nextUint32(): number {
    if (this.index >= MT_N) this.twist();
    let y = this.state[this.index++]!;
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /**
   * CPUGeneratorImpl::random64(): two outputs, the FIRST one in the high word.
   * Returned as a pair because a uint64 does not fit a JS number exactly.
   */
  nextUint64(): { hi: number; lo: number } {
    const hi = this.nextUint32();
    const lo = this.nextUint32();
    return { hi, lo };
  }

  private twist(): void {
    const mt = this.state;
    for (let i = 0; i < MT_N; i++) {
      const y = (mt[i]! & UPPER_MASK) | (mt[(i + 1) % MT_N]! & LOWER_MASK);
      mt[i] = mt[(i + MT_M) % MT_N]! ^ (y >>> 1) ^ (y & 1 ? MATRIX_A : 0);
    }
    this.index = 0;
  }
}

/** Two's-complement low 32 bits of a safe integer, as an unsigned number. */
function low32(x: number): number {
  const r = x % TWO_POW_32;
  return r < 0 ? r + TWO_POW_32 : r;
}

/**
 * (hi * 2^32 + lo) mod m, exactly, for 1 <= m <= 2^32 without BigInt: folds the low word
 * in 16 bits at a time so every intermediate stays below 2^53.
 */
export function uint64Mod(hi: number, lo: number, m: number): number {
  let r = hi % m;
  r = (r * 0x10000 + (lo >>> 16)) % m;
  r = (r * 0x10000 + (lo & 0xffff)) % m;
  return r;
}

/**
 * randperm_cpu switches algorithm at `n < std::numeric_limits<uint32_t>::max() / 20`
 * (integer division: 4294967295 / 20 = 214748364).
 */
export const RANDPERM_SMALL_N_LIMIT = Math.floor(0xffffffff / 20);

/** Largest n we accept: values 0..n-1 must fit the Uint32Array we build the permutation in. */
const RANDPERM_MAX_N = TWO_POW_32;

/**
 * Same as `randperm` but fills a typed array with an existing generator (advancing it),
 * which is what torch.randperm(n, generator=g) does to g.
 */
export function randpermWithGenerator(n: number, gen: Mt19937): Uint32Array {
  if (!Number.isSafeInteger(n) || n < 0 || n > RANDPERM_MAX_N) {
    throw new RangeError(`Invalid n ${String(n)}: n must be an integer in [0, ${RANDPERM_MAX_N}]`);
  }
  const r = new Uint32Array(n);
  if (n < RANDPERM_SMALL_N_LIMIT) {
    // "for small n, preserve old behavior": identity, then for each i swap r[i] with
    // r[i + random() % (n - i)]. The loop stops at n - 2, so n - 1 draws in total.
    for (let i = 0; i < n; i++) r[i] = i;
    for (let i = 0; i < n - 1; i++) {
      const z = gen.nextUint32() % (n - i);
      const save = r[i]!;
      r[i] = r[z + i]!;
      r[z + i] = save;
    }
  } else {
    shuffleInsideOut(r, gen);
  }
  return r;
}

/**
 * torch's large-n branch: "inside-out" Fisher-Yates with z = random64() % (i + 1), n draws.
 * Exported only so tests can exercise it on small arrays; randperm picks it by itself.
 */
export function shuffleInsideOut(r: Uint32Array, gen: Mt19937): void {
  for (let i = 0; i < r.length; i++) {
    const { hi, lo } = gen.nextUint64();
    const z = uint64Mod(hi, lo, i + 1);
    // Same three stores as torch, in the same order (z may equal i).
    r[i] = i;
    r[i] = r[z]!;
    r[z] = i;
  }
}

/**
 * `g = torch.Generator(); g.manual_seed(seed); torch.randperm(n, generator=g).tolist()`.
 */
export function randperm(n: number, seed: number): number[] {
  return Array.from(randpermWithGenerator(n, new Mt19937(seed)));
}

export interface EpochOrderOptions {
  /** Default true, like torch. */
  shuffle?: boolean;
  /** Default 0, like torch. */
  seed?: number;
  /** Default 0. */
  epoch?: number;
}

/**
 * The global (un-sharded, un-padded) order of one epoch, the `indices` list that
 * DistributedSampler.__iter__ builds before padding: randperm(len, seed + epoch) when
 * shuffling, else 0..len-1.
 */
export function epochOrder(datasetLength: number, options: EpochOrderOptions = {}): number[] {
  return Array.from(epochOrderArray(datasetLength, options));
}

function epochOrderArray(datasetLength: number, options: EpochOrderOptions): Uint32Array {
  checkDatasetLength(datasetLength);
  const shuffle = options.shuffle ?? true;
  const seed = options.seed ?? 0;
  const epoch = options.epoch ?? 0;
  checkSafeInteger('seed', seed);
  checkSafeInteger('epoch', epoch);
  if (!shuffle) {
    const order = new Uint32Array(datasetLength);
    for (let i = 0; i < datasetLength; i++) order[i] = i;
    return order;
  }
  const effectiveSeed = seed + epoch;
  if (!Number.isSafeInteger(effectiveSeed)) {
    throw new RangeError(
      `Invalid seed + epoch ${seed} + ${epoch}: the sum must be a safe integer ` + `(|seed + epoch| <= ${Number.MAX_SAFE_INTEGER})`,
    );
  }
  return randpermWithGenerator(datasetLength, new Mt19937(effectiveSeed));
}

export interface DistributedSamplerOptions {
  /** World size: a positive integer. */
  numReplicas: number;
  /** This replica's rank: an integer in [0, numReplicas - 1]. */
  rank: number;
  /** Shuffle with randperm(len, seed + epoch). Default true, like torch. */
  shuffle?: boolean;
  /** Must be identical on all ranks. Default 0, like torch. */
  seed?: number;
  /** Truncate the tail instead of padding. Default false, like torch. */
  dropLast?: boolean;
  /**
   * Not in torch. A position in the epoch's global order (see `epochOrder`); only
   * `order.slice(startIndex)` is sharded, with torch's padding/truncation rule applied to
   * that remainder. Used to resume mid-epoch or to re-shard after the set of replicas
   * changed. Default 0, which is exactly torch's behaviour. Must be in [0, datasetLength].
   * It stays in effect across setEpoch() until changed with setStartIndex().
   */
  startIndex?: number;
}

/** A sampler's position: see `DistributedSampler.stateDict`. */
export interface SamplerState {
  epoch: number;
  position: number;
}

/**
 * torch.utils.data.distributed.DistributedSampler over a dataset of `datasetLength` items.
 * With startIndex = 0 (the default) every field and every index list equals torch's.
 */
export class DistributedSampler implements Iterable<number> {
  readonly datasetLength: number;
  readonly numReplicas: number;
  readonly rank: number;
  readonly shuffle: boolean;
  readonly seed: number;
  readonly dropLast: boolean;
  private _epoch = 0;
  private _startIndex = 0;
  private _numSamples = 0;
  private _totalSize = 0;
  /** The last epoch's global order, since randperm of a large dataset is not free. */
  private cachedOrder: { epoch: number; order: Uint32Array } | undefined;

  constructor(datasetLength: number, options: DistributedSamplerOptions) {
    checkDatasetLength(datasetLength);
    const { numReplicas, rank } = options;
    if (!Number.isSafeInteger(numReplicas) || numReplicas < 1) {
      throw new RangeError(`Invalid numReplicas ${String(numReplicas)}, numReplicas should be a positive integer`);
    }
    // Same wording as torch's ValueError, plus the integer requirement.
    if (!Number.isSafeInteger(rank) || rank < 0 || rank >= numReplicas) {
      throw new RangeError(`Invalid rank ${String(rank)}, rank should be an integer in the interval [0, ${numReplicas - 1}]`);
    }
    const seed = options.seed ?? 0;
    checkSafeInteger('seed', seed);
    this.datasetLength = datasetLength;
    this.numReplicas = numReplicas;
    this.rank = rank;
    this.shuffle = options.shuffle ?? true;
    this.seed = seed;
    this.dropLast = options.dropLast ?? false;
    this.setStartIndex(options.startIndex ?? 0);
  }

  get epoch(): number {
    return this._epoch;
  }

  get startIndex(): number {
    return this._startIndex;
  }

  /** Samples this rank yields per epoch: torch's `num_samples`. */
  get numSamples(): number {
    return this._numSamples;
  }

  /** numSamples * numReplicas: torch's `total_size`. */
  get totalSize(): number {
    return this._totalSize;
  }

  /** `len(sampler)` in torch. */
  get length(): number {
    return this._numSamples;
  }

  /**
   * Where this sampler is (torchdata's StatefulDistributedSampler has the same pair): the epoch,
   * and the position in the epoch's global order from which the rest of the epoch is sharded.
   * The state does not depend on the rank or the number of replicas, so a group of another size
   * can `loadStateDict` it and re-shard the rest of the epoch among its own ranks.
   */
  stateDict(): SamplerState {
    return { epoch: this._epoch, position: this._startIndex };
  }

  /** Continues from `state`: sets the epoch and shards the global order from `state.position` on. */
  loadStateDict(state: SamplerState): void {
    this.setEpoch(state.epoch);
    this.setStartIndex(state.position);
  }

  /**
   * How many of this rank's indices, at the end of `indices()`, are padding: repeats that torch
   * adds so that every rank gets the same number (0 with dropLast, or when the rest divides evenly).
   */
  get numPadding(): number {
    const remaining = this.datasetLength - this._startIndex;
    // Positions rank, rank + n, ... below numSamples * n; those at or past `remaining` are padding.
    const last = this.rank + (this._numSamples - 1) * this.numReplicas;
    if (this._numSamples === 0 || last < remaining) return 0;
    const firstPadded = remaining <= this.rank ? 0 : Math.ceil((remaining - this.rank) / this.numReplicas);
    return this._numSamples - firstPadded;
  }

  /** Like torch's set_epoch: call before each epoch so shuffling differs per epoch. */
  setEpoch(epoch: number): void {
    checkSafeInteger('epoch', epoch);
    this._epoch = epoch;
  }

  /** Shard only the global order from `startIndex` on (see the option's doc). */
  setStartIndex(startIndex: number): void {
    if (!Number.isSafeInteger(startIndex) || startIndex < 0 || startIndex > this.datasetLength) {
      throw new RangeError(
        `Invalid startIndex ${String(startIndex)}, startIndex should be an integer in the ` +
          `interval [0, ${this.datasetLength}] (the dataset length)`,
      );
    }
    this._startIndex = startIndex;
    const remaining = this.datasetLength - startIndex;
    // torch computes these with float division and math.ceil; doing the same keeps us
    // identical even where float rounding would matter (lengths near 2^53).
    let numSamples: number;
    if (this.dropLast && remaining % this.numReplicas !== 0) {
      // Largest count such that every rank gets the same number without padding.
      numSamples = Math.ceil((remaining - this.numReplicas) / this.numReplicas);
    } else {
      numSamples = Math.ceil(remaining / this.numReplicas);
    }
    // Math.ceil(-0.6) is -0 in JS; Python's math.ceil gives 0.
    this._numSamples = numSamples === 0 ? 0 : numSamples;
    this._totalSize = this._numSamples * this.numReplicas;
  }

  /** This rank's indices for the current epoch, in iteration order. */
  indices(): number[] {
    const order = this.globalOrder();
    const start = this._startIndex;
    const remaining = order.length - start;
    const out = new Array<number>(this._numSamples);
    // Position p of the padded (or truncated) list of length totalSize. Padding repeats
    // the list from its head: `indices += (indices * ceil(pad / len))[:pad]` is the same as
    // element p - len wrapped modulo len. With dropLast, totalSize <= remaining so p never
    // reaches the padding.
    for (let k = 0, p = this.rank; k < this._numSamples; k++, p += this.numReplicas) {
      const q = p < remaining ? p : (p - remaining) % remaining;
      out[k] = order[start + q]!;
    }
    return out;
  }

  [Symbol.iterator](): Iterator<number> {
    return this.indices()[Symbol.iterator]();
  }

  private globalOrder(): Uint32Array {
    const cached = this.cachedOrder;
    if (cached !== undefined && cached.epoch === this._epoch) return cached.order;
    const order = epochOrderArray(this.datasetLength, {
      shuffle: this.shuffle,
      seed: this.seed,
      epoch: this._epoch,
    });
    this.cachedOrder = { epoch: this._epoch, order };
    return order;
  }
}

function checkDatasetLength(datasetLength: number): void {
  if (!Number.isSafeInteger(datasetLength) || datasetLength < 0) {
    throw new RangeError(`Invalid datasetLength ${String(datasetLength)}, datasetLength should be a non-negative integer`);
  }
}

function checkSafeInteger(name: string, value: number): void {
  if (!Number.isSafeInteger(value)) {
    throw new RangeError(
      `Invalid ${name} ${String(value)}, ${name} should be an integer ` + `(a safe integer, |${name}| <= ${Number.MAX_SAFE_INTEGER})`,
    );
  }
}
