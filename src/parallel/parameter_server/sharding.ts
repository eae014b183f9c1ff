/**
 * How a model's parameters are spread over K parameter servers (TensorFlow's variable
 * partitioning for ParameterServerStrategy, with whole variables: a parameter is never cut). Pure
 * arithmetic, no tensors: every rank computes the same layout from the parameters' sizes and K,
 * so the layout never needs to travel.
 *
 * A shard's flat buffer (what a worker pushes and pulls) holds its parameters in model order
 * (ascending index), each flattened; `splitByShard` and `joinShards` convert between the model's
 * flat buffer (all trainable weights in `model.trainableWeights` order, as DDP and
 * `flatTrainableWeights` lay them out) and the K shards' buffers.
 */

export interface ShardLayout {
  numServers: number;
  /** Each parameter's element count, in model order (the input). */
  sizes: number[];
  /** The parameters each server holds (indices into the model's trainable weights), ascending. */
  shards: number[][];
  /** The server holding each parameter. */
  owner: number[];
  /** Where each parameter starts in its server's flat buffer (elements). */
  offsetInShard: number[];
  /** Where each parameter starts in the model's flat buffer (elements). */
  offsetInModel: number[];
  /** Elements each server holds: the length of its flat buffer. */
  shardNumel: number[];
}

/**
 * Spreads whole parameters over `numServers` servers, balanced by size: largest parameter first
 * (ties: lower index first), each to the server holding the fewest elements so far (ties: the one
 * holding fewer parameters, then the lower server index). The greedy rule (LPT) keeps the largest
 * load within 4/3 of the best possible, and every server gets at least one parameter (an empty
 * server is always among the least loaded). Deterministic: the same sizes and K give the same
 * layout on every rank.
 *
 * Throws RangeError for a `numServers` that is not a positive integer or exceeds the number of
 * parameters (a server must hold at least one whole parameter), and for sizes that are not
 * non-negative integers.
 */
export function shardParameters(sizes: number[], numServers: number): ShardLayout {
  if (!Number.isSafeInteger(numServers) || numServers < 1) {
    throw new RangeError(`the number of parameter servers must be a positive integer, got ${numServers}`);
  }
  sizes.forEach((s, i) => {
    if (!Number.isSafeInteger(s) || s < 0)
      throw new RangeError(`parameter ${i} has size ${s}: sizes must be non-negative integers (element counts)`);
  });
  if (numServers > sizes.length) {
    throw new RangeError(
      `cannot shard ${sizes.length} parameter tensor(s) over ${numServers} parameter servers: each server holds whole parameters, ` +
        `so use at most ${sizes.length} server(s) (make the other ranks workers), or a model with more parameter tensors`,
    );
  }
  const order = sizes.map((_, i) => i).sort((a, b) => sizes[b] - sizes[a] || a - b);
  const load = new Array<number>(numServers).fill(0);
  const count = new Array<number>(numServers).fill(0);
  const owner = new Array<number>(sizes.length).fill(-1);
  for (const p of order) {
    let best = 0;
    for (let k = 1; k < numServers; k++) {
      if (load[k] < load[best] || (load[k] === load[best] && count[k] < count[best])) best = k;
    }
    owner[p] = best;
    load[best] += sizes[p];
    count[best]++;
  }
  const shards: number[][] = Array.from({ length: numServers }, () => []);
  owner.forEach((k, p) => {
    shards[k].push(p);
  });
  const offsetInShard = new Array<number>(sizes.length).fill(0);
  for (const shard of shards) {
    let at = 0;
    for (const p of shard) {
      offsetInShard[p] = at;
      at += sizes[p];
    }
  }
  const offsetInModel: number[] = [];
  let total = 0;
  for (const s of sizes) {
    offsetInModel.push(total);
    total += s;
  }
  return { numServers, sizes: [...sizes], shards, owner, offsetInShard, offsetInModel, shardNumel: load };
}

/** The model's flat buffer cut into each server's flat buffer (copies, in shard order). */
export function splitByShard(layout: ShardLayout, flat: Float32Array): Float32Array[] {
  const total = layout.shardNumel.reduce((a, b) => a + b, 0);
  if (flat.length !== total) throw new RangeError(`the model's flat buffer has ${flat.length} elements, the layout ${total}`);
  const parts = layout.shardNumel.map((n) => new Float32Array(n));
  layout.sizes.forEach((size, p) => {
    const from = layout.offsetInModel[p];
    parts[layout.owner[p]].set(flat.subarray(from, from + size), layout.offsetInShard[p]);
  });
  return parts;
}

/** The servers' flat buffers put back together into the model's flat buffer. */
export function joinShards(layout: ShardLayout, parts: Float32Array[]): Float32Array {
  if (parts.length !== layout.numServers)
    throw new RangeError(`got ${parts.length} shard buffer(s), the layout has ${layout.numServers} servers`);
  parts.forEach((part, k) => {
    if (part.length !== layout.shardNumel[k])
      throw new RangeError(`shard ${k}'s buffer has ${part.length} elements, the layout gives it ${layout.shardNumel[k]}`);
  });
  const flat = new Float32Array(layout.shardNumel.reduce((a, b) => a + b, 0));
  layout.sizes.forEach((size, p) => {
    const from = layout.offsetInShard[p];
    flat.set(parts[layout.owner[p]].subarray(from, from + size), layout.offsetInModel[p]);
  });
  return flat;
}
