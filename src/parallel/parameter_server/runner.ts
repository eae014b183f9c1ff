/**
 * Parameter-server training across tabs (TensorFlow's ParameterServerStrategy, asynchronous, and
 * CentralStorageStrategy, synchronous), for any model: what a user's script runs, as it runs
 * `runElastic` for DDP. `runParameterServer` joins the session's group and gives each rank a
 * role: K ranks serve the model's variables (sharded whole, balanced by size: `shardParameters`),
 * the others are workers. The server (Node) still never holds a tensor; servers are tabs.
 *
 * A worker loops: pull every shard (one request and reply per server, over the group's links),
 * compute the gradients of its batch on those values, push them; asynchronous servers apply each
 * push as it comes (`ParameterServerShard.apply`: staleness bound, lr scaling, dedupe), with no
 * barrier across workers. CentralStorage (K = 1) waits for every worker's push of step t,
 * averages and applies once (`CentralStorageAccumulator`).
 *
 * Data: server 0 hands out the samples with each reply, as leases of the epoch's shuffled order
 * (tf.data service's dynamic sharding): an asynchronous worker gets the next `batchSize` samples
 * of the epoch, whatever its speed, so an epoch is the dataset once ("virtual epochs": progress
 * is counted in samples processed by all workers together) and every sample is accounted for:
 * applied, dropped as stale, refused, or lost with a worker that left holding it. CentralStorage
 * hands worker i of W the DistributedSampler shard i of the step's W x batchSize samples, as DDP
 * takes them, so that it trains to DDP's weights.
 *
 * Rounds: a lost rank makes the session's rendezvous form a new round from the rest (within a second). No
 * state moves then: servers keep their shards in memory, workers keep the push they had not
 * delivered and deliver it again (a push is applied at most once, by its step id), and training
 * goes on; what a lost worker costs is the batch it held. A lost server stops every worker
 * ("parameter server k was lost ...") until a tab joins and takes its place; that tab loads the
 * shard's latest checkpoint (each server saves its own, `ps-<k>`, every `checkpointEvery`
 * updates; one due while a save uploads follows it), so at most that many updates are lost, and
 * those applied while a save uploads. Tabs that join while training runs are
 * admitted at once (server 0 sends everyone to a regroup), pull the parameters and start.
 *
 * Roles follow tabs, not ranks (ranks change from round to round), and the server, not the tabs,
 * says who holds which: a server place is held on the server for the member that took it until
 * that member leaves the group (`StoreClient.claim`), and a worker is its member id, which the
 * server tells every rank with each round. Servers and workers keep their roles; new tabs fill
 * the servers' vacant places first. The store also keeps the roles (`ps/roles`), each server's version (`ps/server-<k>`) and server 0's
 * leases (`ps/leases`), about once a second: the server holds records, never a tensor.
 *
 * Beside this module: serve.ts (a server's side of a round), figures.ts (the rates and counts
 * the status reports give), places.ts (claiming server places), final_values.ts (the run's last
 * collectives), roles.ts, leases.ts, shard.ts, wire.ts (the pull/push messages).
 */
import { isRecoverable } from '../../wire/errors.ts';
import { REGROUP, runAgent, samplerSettings } from '../../elastic/agent.ts';
import { recordEvent } from '../events.ts';
import { hashFloat32 } from '../../wire/hash.ts';
import { flatTrainableWeights } from '../replicas.ts';
import type { StepMetrics } from '../../elastic/vote.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { RendezvousHandler, type Round } from '../../c10d/rendezvous.ts';
import type { Json } from '../../checkpoint/state_dict.ts';
import { restoreShard, ShardSaver } from './checkpoint.ts';
import { LeaseBook, leaseIndices, type Lease, type PsSampleCounts } from './leases.ts';
import { assignFlatWeights } from '../replicas.ts';
import { rolesOf, type Role } from './roles.ts';
import { claimPlaces, newShard, waitForServer } from './places.ts';
import type { PendingPush } from './worker.ts';
import { gatherFinal } from './final_values.ts';
import type { ParameterServerShard } from './shard.ts';
import {
  checkOptions,
  type ParameterServerRunOptions,
  type ParameterServerRunResult,
  type PsRunEvent,
  type PsServerSlot,
  type PsStrategy,
} from './types.ts';
import { joinShards, shardParameters, splitByShard, type ShardLayout } from './sharding.ts';
import { CONTROL, REQ_END, REQ_PULL, REQ_PUSH, message, payload, readReply, writeRequest, type Control } from './wire.ts';
import { serveRound } from './serve.ts';
import { ServerFigures, WorkerFigures } from './figures.ts';

export type { Lease, PsSampleCounts } from './leases.ts';
export type {
  ParameterServerRunOptions,
  ParameterServerRunResult,
  PsRunEvent,
  PsServerSlot,
  PsStatus,
  PsStrategy,
  WorkerStepContext,
  WorkerStepResult,
} from './types.ts';

export async function runParameterServer<M extends StepMetrics>(options: ParameterServerRunOptions<M>): Promise<ParameterServerRunResult> {
  const run = new PsRun(options);
  const handler = await RendezvousHandler.start({ ...options, min: run.min, reconnect: true }, (e) => options.onRendezvous?.(e));
  const signal = options.signal;
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal!.reason instanceof Error ? signal!.reason : new Error(String(signal!.reason ?? 'aborted')));
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
  });
  aborted.catch(() => {});
  try {
    return await Promise.race([run.run(handler), aborted]);
  } catch (err) {
    handler.shutdown();
    throw err;
  } finally {
    run.stopStatus();
    if (onAbort) signal?.removeEventListener('abort', onAbort);
  }
}

class PsRun<M extends StepMetrics> {
  readonly strategy: PsStrategy;
  readonly numServers: number;
  readonly min: number;
  private readonly layout: ShardLayout;
  private handler!: RendezvousHandler;
  private role: Role | null = null;
  private workerId = -1;
  private shard: ParameterServerShard | null = null;
  // Worker state.
  private stepId = 0;
  private pending: PendingPush | null = null;
  private versions: number[];
  private readonly wstats = new WorkerFigures();
  /** Server 0's book of the run's samples (the others keep one unused: any tab may become server 0). */
  private readonly book: LeaseBook;
  // Server figures.
  private readonly saves: ShardSaver;
  private restoredFrom: number | null = null;
  private readonly figures = new ServerFigures();
  private generations = 0;
  private statusTimer: ReturnType<typeof setInterval> | null = null;
  private current: { pg: ProcessGroup; servers: PsServerSlot[]; workers: Array<{ workerId: number; rank: number }> } | null = null;
  private heardSamples: PsSampleCounts | null = null;
  private roundKey = '';
  private readonly started = performance.now();
  private stopReason: 'done' | 'request' = 'done';

  constructor(private readonly o: ParameterServerRunOptions<M>) {
    this.strategy = o.strategy ?? 'async';
    this.numServers = o.numServers ?? 1;
    checkOptions(o, this.strategy, this.numServers);
    this.min = o.min ?? this.numServers + 1;
    const sizes = o.model.trainableWeights.map((w) => w.shape.reduce<number>((a, b) => a * (b ?? 1), 1));
    this.layout = shardParameters(sizes, this.numServers);
    this.versions = new Array<number>(this.numServers).fill(0);
    this.saves = new ShardSaver(
      // The run's signal ends its saves too: an aborted run, like a closed tab, saves nothing more.
      { url: o.url, session: o.session, token: o.token, ...(o.signal ? { signal: o.signal } : {}) },
      {
        shard: () => this.shard,
        // Server 0's leases go with its shard: the tab that takes its place hands out the rest.
        meta: (index) => {
          const leases = index === 0 ? this.book.snapshot() : undefined;
          return { ...(o.checkpointMeta === undefined ? {} : { user: o.checkpointMeta }), ...(leases ? { leases } : {}) } as Json;
        },
        emit: (e) => this.emit(e),
      },
    );
    this.book = new LeaseBook({
      strategy: this.strategy,
      datasetLength: o.datasetLength,
      batchSize: o.batchSize,
      epochs: o.epochs,
      steps: o.steps,
      shuffle: o.shuffle,
      seed: o.seed,
      workersPerStep: o.max - this.numServers,
    });
  }

  stopStatus(): void {
    if (this.statusTimer) clearInterval(this.statusTimer);
    this.statusTimer = null;
  }

  async run(handler: RendezvousHandler): Promise<ParameterServerRunResult> {
    this.handler = handler;
    this.statusTimer = setInterval(() => this.reportStatus(), this.o.statusIntervalMs ?? 1000);
    return runAgent(handler, {
      round: (round) => this.round(round),
      failed: (round, err) => this.failed(round, err),
      regrouping: (round) => this.emit({ type: 'regroup', round: round.key, rank: round.pg.rank, waiting: this.handler.numNodesWaiting() }),
      peerLost: (round, e) => {
        this.emit({ type: 'peer-lost', round: round.key, rank: round.pg.rank, peer: e.rank, reason: e.reason });
        recordEvent({ type: 'peer-lost', round: round.key, rank: round.pg.rank, peer: e.rank, reason: e.reason });
      },
    });
  }

  /** One round: roles, then serving or working until server 0 says stop (the run's result) or regroup. */
  private async round(round: Round): Promise<ParameterServerRunResult | typeof REGROUP> {
    this.generations++;
    const vacant = await this.startRound(round);
    if (vacant !== null) {
      await waitForServer(this.handler, round, vacant, this.o, (e) => this.emit(e));
      return REGROUP;
    }
    const outcome = this.role!.kind === 'server' ? await this.serve(round.pg) : await this.work(round.pg);
    return outcome === CONTROL.regroup ? REGROUP : this.finish(round);
  }

  private async failed(round: Round, err: unknown): Promise<'retry'> {
    const error = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    const recoverable = isRecoverable(err);
    this.emit({ type: 'failure', round: round.key, rank: round.pg.rank, error, recoverable });
    recordEvent({
      type: 'failure',
      round: round.key,
      rank: round.pg.rank,
      step: this.stepId,
      inFlight: this.pending?.stepId ?? null,
      error,
      recoverable,
    });
    if (!recoverable) throw err;
    // CentralStorage collects the step again from the new round's workers, sharded among them.
    if (this.strategy === 'central') this.pending = null;
    return 'retry';
  }

  /**
   * Who is what in this round. Server places are held on the server (`claim`, bound to the
   * member, freed when it leaves the group), so a tab cannot say it serves a place it does not
   * hold; a worker is its member id, which the server tells every rank. One all-gather says
   * which ranks are new; vacant places go to new tabs (a server back from a lost connection to
   * its own place first, the others in rank order); every rank then checks that the server holds
   * exactly that. Returns the index of a server place nobody can take (null: every place is served).
   */
  private async startRound(round: Round): Promise<number | null> {
    const { pg, members } = round;
    const K = this.numServers;
    const me = members[pg.rank]!;
    if (me !== this.workerId) {
      // A new member (this tab reconnected) is a new worker: the push it held went with the old
      // one, whose lease server 0 counts as lost. Its step ids start again.
      this.workerId = me;
      this.stepId = 0;
      this.pending = null;
    }
    const wasServer = this.role?.kind === 'server' ? this.role.index : -1;
    const holders = await claimPlaces(pg, this.handler.store, members, K, this.role === null, wasServer);
    // A holder that is in the group but not in this round (waiting) leaves its place empty for now.
    const { serverRank, workers } = rolesOf(holders, members);
    const servers = serverRank.map((rank, index) => ({
      index,
      rank,
      parameters: this.layout.shards[index]!,
      numel: this.layout.shardNumel[index]!,
    }));
    const myIndex = serverRank.indexOf(pg.rank);
    this.role = myIndex >= 0 ? { kind: 'server', index: myIndex } : { kind: 'worker' };
    this.current = { pg, servers, workers };

    if (this.role.kind === 'server') await this.takePlace(this.role.index);
    else if (this.shard) {
      // A server this tab was is someone else's place now (it cannot happen with the rules above, but never serve twice).
      this.shard.dispose();
      this.shard = null;
    }
    if (this.role.kind === 'server' && this.role.index === 0) {
      // Workers of the last round that are gone took their leases with them.
      for (const { workerId, samples } of this.book.roundChanged(new Set(workers.map((w) => w.workerId))))
        this.emit({ type: 'samples-lost', workerId, samples });
    }
    const index = this.role.kind === 'server' ? this.role.index : this.workerId;
    this.emit({ type: 'round', round: round.key, rank: pg.rank, worldSize: pg.worldSize, role: this.role.kind, index, servers, workers });
    // What a launcher hears of any run (torch.distributed.elastic's events): who holds which rank.
    // Workers report no 'batch' events: server 0's leases account for the samples instead.
    this.roundKey = round.key;
    recordEvent({
      type: 'round',
      round: round.key,
      rank: pg.rank,
      worldSize: pg.worldSize,
      step: this.role.kind === 'server' ? (this.shard?.version ?? 0) : this.stepId,
      epoch: this.role.kind === 'server' && index === 0 ? this.book.samples.epoch : (this.heardSamples?.epoch ?? 0),
      position: 0,
      // A lease's batch may be short: no dropLast.
      ...samplerSettings({ ...this.o, dropLast: false }),
      source: this.restoredFrom !== null && this.role.kind === 'server' ? 'checkpoint' : this.generations === 1 ? 'fresh' : 'replica',
      from: servers[0]!.rank,
      redone: false,
      note: this.role.kind === 'server' ? `parameter server ${index} of ${K}` : `worker ${index}, pulling from ${K} server(s)`,
      samplers: 0,
    });
    this.o.onRound?.({ pg, role: this.role.kind, index });
    // The roles in the session's store (server 0 writes them): who serves what, who works.
    if (this.role.kind === 'server' && index === 0)
      this.record('ps/roles', { round: round.key, servers: servers.map(({ index: k, rank }) => ({ index: k, rank })), workers });
    this.reportStatus();
    const vacant = serverRank.indexOf(-1);
    return vacant >= 0 ? vacant : workers.length === 0 ? -1 : null;
  }

  /** This tab serves place k: keeps the shard it has, or builds one (from the latest checkpoint when there is one). */
  private async takePlace(k: number): Promise<void> {
    if (this.shard?.index === k) return;
    this.shard?.dispose();
    const o = this.o;
    this.shard = newShard(o, this.layout, k);
    if (o.resume ?? true) {
      const restored = await restoreShard(this.shard, { url: o.url, session: o.session, token: o.token });
      if (restored) {
        this.restoredFrom = restored.version;
        this.emit({ type: 'restored', index: k, version: restored.version, name: restored.name });
        const leases = (restored.meta as { leases?: Parameters<LeaseBook['load']>[0] } | undefined)?.leases;
        if (k === 0 && typeof leases === 'object' && leases !== null) this.book.load(leases);
      }
    }
  }

  // ---- servers ----

  /** Serves every worker of the round until each has been told to stop or regroup. */
  private serve(pg: ProcessGroup): Promise<Control> {
    const index = (this.role as { index: number }).index;
    return serveRound({
      pg,
      workers: this.current!.workers,
      shard: this.shard!,
      index,
      strategy: this.strategy,
      book: this.book,
      stopRequested: () => {
        if (!this.o.shouldStop?.()) return false;
        this.stopReason = 'request';
        return true;
      },
      waiting: () => this.handler.numNodesWaiting(),
      noteUpdate: () => this.figures.noteUpdate(this.shard!.version),
      checkpoint: () => this.saves.due(),
    });
  }

  // ---- workers ----

  /** Pulls, computes, pushes, until server 0 says stop or regroup. */
  private async work(pg: ProcessGroup): Promise<Control> {
    const { servers } = this.current!;
    const o = this.o;
    const K = this.numServers;
    const bufs = servers.map((s) => message(s.numel));
    const replies = servers.map((s) => message(s.numel));
    const values: Float32Array[] = servers.map((s) => new Float32Array(s.numel));
    for (;;) {
      // Server 0 first: its reply says whether to go on, and hands out the batch.
      let control: Control = CONTROL.continue;
      let lease: Lease | null = null;
      const pending = this.pending;
      for (let k = 0; k < K; k++) {
        const ending = k > 0 && control !== CONTROL.continue;
        const kind = (pending ? REQ_PUSH : REQ_PULL) | (ending ? REQ_END : 0);
        writeRequest(
          bufs[k]!,
          {
            kind,
            stepId: pending?.stepId ?? 0,
            version: pending?.versions[k] ?? 0,
            samples: pending?.samples ?? 0,
            endControl: ending ? control : 0,
          },
          pending ? pending.parts[k]! : null,
        );
        const server = servers[k]!;
        await pg.send(bufs[k]!, server.rank);
        const r = readReply(await pg.recv(replies[k]!, server.rank));
        this.versions[k] = r.version;
        values[k]!.set(payload(replies[k]!));
        if (k === 0) {
          control = r.control as Control;
          if (control !== CONTROL.continue && control !== CONTROL.stop && control !== CONTROL.regroup) {
            throw new RangeError(
              `parameter server 0 (rank ${server.rank}) sent control ${control}, which is none of continue, stop, regroup`,
            );
          }
          lease = r.lease;
          this.heardSamples = r.counts;
          if (pending) this.wstats.noteVerdict(r.verdict, r.staleness);
        }
      }
      this.wstats.pulls++;
      this.pending = null;
      assignFlatWeights(o.model, joinShards(this.layout, values), 'the values pulled from the parameter servers');
      if (control !== CONTROL.continue) return control;
      const indices = leaseIndices(lease!, o);
      const stepId = ++this.stepId;
      const t0 = performance.now();
      const { grads, metrics } = await o.step({ indices, model: o.model, workerId: this.workerId, stepId, epoch: lease!.epoch, pg });
      const computeMs = performance.now() - t0;
      this.pending = { stepId, parts: splitByShard(this.layout, grads), versions: [...this.versions], samples: indices.length };
      this.wstats.pushes++;
      this.wstats.samples += indices.length;
      o.onWorkerStep?.({ workerId: this.workerId, stepId, indices, metrics, computeMs, staleness: this.wstats.lastStaleness });
      recordEvent({
        type: 'step',
        round: this.roundKey,
        rank: pg.rank,
        step: stepId,
        epoch: lease!.epoch,
        totalSteps: 0,
        metrics: metrics ? [metrics] : [],
        elapsedMs: performance.now() - this.started,
      });
    }
  }

  // ---- the end ----

  /** Everyone has stopped: every rank gets every shard's final values, and server 0's counts. */
  private async finish(round: Round): Promise<ParameterServerRunResult> {
    const { pg } = round;
    const { servers, workers } = this.current!;
    this.emit({ type: 'stop', round: round.key, rank: pg.rank, reason: this.stopReason });
    const serving = this.role?.kind === 'server' ? this.role.index : -1;
    const { samples, versions } = await gatherFinal(pg, servers, this.layout, this.o.model, serving, this.shard, this.book);
    // After the last collective (the workers need not wait): the result counts the last save, and no event follows it.
    await this.saves.settle();
    this.heardSamples = samples;
    this.reportStatus();
    const role = this.role!;
    const weightHash = hashFloat32(await flatTrainableWeights(this.o.model));
    recordEvent({
      type: 'end',
      round: round.key,
      rank: pg.rank,
      worldSize: pg.worldSize,
      steps: versions[0] ?? 0,
      epoch: samples.epoch,
      generations: this.generations,
      stepsRedone: 0,
      stoppedBy: null,
      weightHash,
    });
    const shardStats = this.shard
      ? { ...this.shard.stats(), updatesPerSec: this.figures.overallUpdatesPerSec(this.shard.version, this.restoredFrom) }
      : undefined;
    return {
      role: role.kind,
      index: role.kind === 'server' ? role.index : this.workerId,
      pg,
      rank: pg.rank,
      worldSize: pg.worldSize,
      model: this.o.model,
      servers,
      workers: workers.length,
      versions,
      samples,
      ...(shardStats ? { shard: shardStats } : {}),
      ...(role.kind === 'worker' ? { worker: this.wstats.result(this.workerId) } : {}),
      checkpoints: this.saves.saved,
      restoredFrom: this.restoredFrom,
      generations: this.generations,
      stoppedBy: this.stopReason,
      close: async () => {
        await pg.barrier().catch(() => {});
        this.shard?.dispose();
        this.shard = null;
        this.handler.shutdown();
      },
    };
  }

  private reportStatus(): void {
    const cur = this.current;
    if (!cur || !this.role) return;
    if (this.role.kind === 'server' && this.shard) {
      // Each server's version, and server 0's leases, in the session's store as they go.
      const stats = this.shard.stats();
      this.record(`ps/server-${this.shard.index}`, {
        rank: cur.pg.rank,
        version: stats.version,
        applied: stats.applied,
        stale: stats.stale,
      });
      if (this.shard.index === 0) this.record('ps/leases', { ...this.book.snapshot() });
    }
    if (!this.o.onStatus) return;
    const base = { strategy: this.strategy, rank: cur.pg.rank, role: this.role.kind, servers: cur.servers, workers: cur.workers };
    if (this.role.kind === 'server' && this.shard) {
      const samples = this.shard.index === 0 ? this.book.samples : this.heardSamples;
      this.o.onStatus({ ...base, server: this.figures.status(this.shard, cur.workers), samples });
      return;
    }
    this.o.onStatus({ ...base, worker: this.wstats.status(this.workerId), samples: this.heardSamples });
  }

  /** Best effort: a record that does not reach the store is written again a second later. */
  private record(key: string, value: Json): void {
    this.handler.store.set(key, JSON.stringify(value)).catch(() => {});
  }

  private emit(e: PsRunEvent): void {
    this.o.onEvent?.(e);
  }
}
