/**
 * Server places: the K places a parameter server holds on the server (`StoreClient.claim`, bound
 * to the member, freed when it leaves the group), how a round's ranks agree on who takes each,
 * the shard a tab builds to serve one, and the wait while one stays vacant. Apart from the
 * runner (runner.ts) so that its round stays about roles and the run, not about claiming.
 */
import { DistTimeoutError, RoleConflictError } from '../../wire/errors.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { RendezvousHandler, Round } from '../../c10d/rendezvous.ts';
import type { StoreClient } from '../../c10d/store.ts';
import { DEFAULT_STORE_TIMEOUT_MS } from '../../wire/protocol.ts';
import { assignPlaces, decodeClaims, encodeClaim } from './roles.ts';
import type { ParameterServerRunOptions, PsRunEvent } from './types.ts';
import { ParameterServerShard } from './shard.ts';
import type { ShardLayout } from './sharding.ts';
import { MAX_MEMBER_ID } from '../../wire/protocol_validation.ts';
import type { StepMetrics } from '../../elastic/vote.ts';

/** The server-held place of parameter server k (`StoreClient.claim`). */
export function placeKey(k: number): string {
  return `ps/place-${k}`;
}

function placeConflict(place: string, holder: number, expected: number): RoleConflictError {
  const who = (m: number) => (m < 0 ? 'nobody' : `member ${m}`);
  return new RoleConflictError(
    `the server says ${who(holder)} holds ${place}, but the ranks agreed on ${who(expected)}: a member took the place while the round started; the round is formed again`,
    place,
    holder,
    expected,
  );
}

/**
 * The holders of the K places once every rank of `pg` agreed on them: one all-gather says which
 * ranks are new (`isNew`; `wasServer`: the place this tab served, -1 none); vacant places go to
 * new tabs (see assignPlaces); this rank claims its own, and every rank then checks that the
 * server holds exactly that (RoleConflictError otherwise).
 */
export async function claimPlaces(
  pg: ProcessGroup,
  store: StoreClient,
  members: readonly number[],
  K: number,
  first: boolean,
  wasServer: number,
): Promise<number[]> {
  const me = members[pg.rank]!;
  const keys = Array.from({ length: K }, (_, k) => placeKey(k));
  const before = await store.claim(keys);
  const isNew = first || (wasServer >= 0 && before[wasServer] !== me);
  const claims = decodeClaims(await pg.allGather(encodeClaim({ isNew, wasServer })), pg.worldSize);
  const intended = assignPlaces(before, claims, members);
  const mine = intended.indexOf(me);
  if (mine >= 0 && before[mine] !== me) {
    const [holder] = await store.claim([keys[mine]!], true);
    if (holder !== me) throw placeConflict(keys[mine]!, holder!, me);
  }
  await pg.barrier();
  const holders = await store.claim(keys);
  for (let k = 0; k < K; k++) if (holders[k] !== intended[k]) throw placeConflict(keys[k]!, holders[k]!, intended[k]!);
  return holders;
}

/** Every rank waits until a tab arrives to take the empty server place `index` (-1: the group has no worker left). */
export async function waitForServer(
  handler: RendezvousHandler,
  round: Round,
  index: number,
  o: { checkpointEvery?: number; timeoutMs?: number },
  emit: (e: PsRunEvent) => void,
): Promise<void> {
  const message =
    index >= 0
      ? `parameter server ${index} was lost: training waits for a tab to take its place, which then resumes from the shard's last checkpoint (every ${o.checkpointEvery ?? 0} updates${(o.checkpointEvery ?? 0) === 0 ? ': none are saved, so it starts from the initial values' : ''})`
      : 'every worker was lost: the servers wait for a tab to join as a worker';
  emit({ type: 'server-lost', round: round.key, index, message });
  const timeoutMs = o.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
  const deadline = Date.now() + timeoutMs;
  while (handler.numNodesWaiting() === 0) {
    if (round.pg.error) throw round.pg.error;
    if (Date.now() > deadline)
      throw new DistTimeoutError(
        `a tab to take the place of ${index >= 0 ? `parameter server ${index}` : 'a worker'} (${message})`,
        timeoutMs,
      );
    await sleep(200);
  }
}

/** A fresh shard for place k, with the run's options (its values from `o.model`). */
export function newShard<M extends StepMetrics>(o: ParameterServerRunOptions<M>, layout: ShardLayout, k: number): ParameterServerShard {
  return ParameterServerShard.fromModel(o.model, layout, k, {
    optimizer: o.optimizer,
    ...(o.maxStaleness === undefined ? {} : { maxStaleness: o.maxStaleness }),
    scaleLrByStaleness: o.scaleLrByStaleness ?? false,
    // Workers are member ids (the server's): below MAX_MEMBER_ID, never reused while it runs.
    numWorkers: MAX_MEMBER_ID + 1,
    checkpointEvery: o.checkpointEvery ?? 0,
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
