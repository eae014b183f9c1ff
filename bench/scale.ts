/**
 * `npm run bench:scale`: how the train job holds up as the class grows, in two parts that write
 * into one bench/results/scale.json and .md (a part run alone keeps the other's figures):
 *
 * - `--part steps` (N = 2, 4, 8, 16 by default, --nprocs): the synthetic MLP on the cpu backend,
 *   fixed size, --steps 40: where a step's time goes on each rank (compute, readback, waiting for
 *   the slowest rank, the wire, apply, the vote, the page's work; mean over ranks of each rank's
 *   mean ms per step), against the same reductions timed bare in the same run; each size with the
 *   vote riding on the gradients' all-reduce and apart (--vote gradients,apart), one after the other.
 * - `--part churn` (N = 4, 8, 16, 32 by default): an elastic run of N tabs (--min N/2, --max N)
 *   with a tab killed, one joining, one frozen, one joining, ... every --churn-every seconds
 *   (15, the rate torchft trains through) until its epoch ends; every sample exactly once and
 *   identical replicas are checked, and each fault's detection, rendezvous and regroup times
 *   are reported against N.
 *
 * Options: --part steps|churn|all --nprocs LIST --churn-every SEC --batch-size 16 --train-size N (churn) --vote gradients,apart
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    part: { type: 'string', default: 'all' },
    nprocs: { type: 'string' },
    'churn-every': { type: 'string', default: '15' },
    'batch-size': { type: 'string', default: '16' },
    'train-size': { type: 'string' },
    vote: { type: 'string', default: 'gradients,apart' },
  },
});
const part = values.part!;
if (!['steps', 'churn', 'all'].includes(part)) {
  console.error(`bench:scale: --part must be steps, churn or all, got "${part}"`);
  process.exit(2);
}
// An empty list runs nothing: `--part churn --nprocs ''` writes scale.md again from scale.json.
const listOf = (s: string) =>
  s
    .split(',')
    .filter((x) => x.trim() !== '')
    .map((x) => Number(x.trim()));
const batchSize = values['batch-size']!;
type VoteMode = 'gradients' | 'apart';
const voteModes = values.vote!.split(',').map((v) => v.trim());
if (voteModes.length === 0 || voteModes.some((v) => v !== 'gradients' && v !== 'apart')) {
  console.error(`bench:scale: --vote takes gradients, apart or both (comma-separated), got "${values.vote}"`);
  process.exit(2);
}
const churnEvery = Number(values['churn-every']);

interface StepRow {
  worldSize: number;
  /** Where the step's vote went: riding on the gradients' all-reduce, or an all-gather of its own. */
  vote?: VoteMode;
  ok: boolean;
  error?: string;
  samplesPerSec?: number;
  timelineMs?: Record<string, number | null>;
  bareAllReduceMs?: number | null;
  commOverBare?: number | null;
  wireOverBare?: number | null;
}

interface FaultRow {
  fault: string;
  worldSize?: number;
  detectedAfterMs?: number;
  recoveredAfterMs?: number;
  /** Of recoveredAfterMs: the rendezvous, then the round's links and the state (runs since 2026-11-28). */
  rendezvousMs?: number;
  stateMs?: number;
  regroupMs?: number;
  admittedAfterMs?: number;
}

interface ChurnRow {
  worldSize: number;
  /** The day this size ran (a size run alone keeps the others' rows). */
  date?: string;
  ok: boolean;
  error?: string;
  seconds?: number;
  steps?: number;
  generations?: number;
  stepsRedone?: number;
  exactlyOnce?: boolean;
  identical?: boolean;
  faults?: FaultRow[];
}

interface Results {
  date: string;
  machine: string;
  steps?: { date: string; rows: StepRow[] };
  churn?: { date: string; everySec: number; rows: ChurnRow[] };
}

const date = new Date().toISOString().slice(0, 10);
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Chromium headless, WebRTC over loopback`;
const dir = join(PROJECT_ROOT, 'bench', 'results');
const jsonPath = join(dir, 'scale.json');
const results: Results = await readFile(jsonPath, 'utf8')
  .then((t) => JSON.parse(t) as Results)
  .catch(() => ({ date, machine }));
results.date = date;
results.machine = machine;

async function save(): Promise<void> {
  await mkdir(dir, { recursive: true });
  await writeFile(jsonPath, `${JSON.stringify(results, null, 2)}\n`);
  await writeFile(join(dir, 'scale.md'), `${markdown(results).join('\n')}\n`);
}

if (part === 'steps' || part === 'all') {
  const rows: StepRow[] = [];
  results.steps = { date, rows };
  for (const n of listOf(values.nprocs ?? '2,4,8,16')) {
    // Both ways at each size, one after the other, so that the machine's drift between sizes does not pass for a difference.
    for (const vote of voteModes as VoteMode[]) {
      console.log(`--- steps: ${n} ranks, vote ${vote === 'gradients' ? 'riding on the gradients' : 'apart'}`);
      const { ok, summary } = await launch({
        nproc: n,
        job: 'train',
        session: `scale-steps-${n}-${Date.now().toString(36)}`,
        timeoutSec: 900,
        jobParams: {
          dataset: 'synthetic',
          backend: 'cpu',
          'batch-size': batchSize,
          steps: '40',
          balance: 'false',
          'vote-with-gradients': String(vote === 'gradients'),
        },
        log: (line) => (line.startsWith('[launch]') ? console.log(line) : undefined),
      });
      const s = summary as Record<string, unknown>;
      rows.push(
        ok
          ? {
              worldSize: n,
              vote,
              ok,
              samplesPerSec: s.samplesPerSec as number,
              timelineMs: s.timelineMs as StepRow['timelineMs'],
              bareAllReduceMs: s.bareAllReduceMs as number,
              commOverBare: s.commOverBare as number,
              wireOverBare: s.wireOverBare as number,
            }
          : { worldSize: n, vote, ok, error: String((s.errors as string[] | undefined)?.[0] ?? 'failed') },
      );
      console.log(JSON.stringify(rows.at(-1)));
      await save();
    }
  }
}

if (part === 'churn' || part === 'all') {
  // Sizes run before at the same rate are kept, each replaced when it runs again: the 32-tab run can be a run of its own.
  const rows: ChurnRow[] = results.churn?.everySec === churnEvery ? results.churn.rows : [];
  results.churn = { date, everySec: churnEvery, rows };
  for (const n of listOf(values.nprocs ?? '4,8,16,32')) {
    console.log(`--- churn: ${n} ranks, a fault every ${churnEvery} s`);
    // A minute or two of training at each size on this machine (a step's time grows with N);
    // --train-size for longer runs (a quiet machine trains 32 tabs' 12,288 samples before a second fault).
    const trainSize = values['train-size'] ?? String(n <= 4 ? 32768 : n <= 8 ? 24576 : n <= 16 ? 16384 : 12288);
    const { ok, summary } = await launch({
      nproc: n,
      job: 'train',
      session: `scale-churn-${n}-${Date.now().toString(36)}`,
      timeoutSec: 1500,
      churnEverySec: churnEvery,
      jobParams: {
        dataset: 'synthetic',
        backend: 'cpu',
        'batch-size': batchSize,
        'train-size': trainSize,
        epochs: '1',
        min: String(Math.max(2, n / 2)),
        max: String(n),
      },
      log: (line) => (line.startsWith('[launch]') ? console.log(line) : undefined),
    });
    const s = summary as Record<string, unknown>;
    const seen = (s.samplesSeen as Array<{ exactlyOnce: boolean; complete: boolean }> | undefined) ?? [];
    const before = rows.findIndex((r) => r.worldSize === n);
    if (before >= 0) rows.splice(before, 1);
    rows.push(
      ok
        ? {
            worldSize: n,
            date,
            ok,
            seconds: s.seconds as number,
            steps: s.steps as number,
            generations: s.generations as number,
            stepsRedone: s.stepsRedone as number,
            exactlyOnce: seen.length > 0 && seen.every((e) => e.exactlyOnce && e.complete),
            identical: s.identical as boolean,
            faults: (s.faults as FaultRow[] | undefined) ?? [],
          }
        : {
            worldSize: n,
            date,
            ok,
            error: String((s.errors as string[] | undefined)?.[0] ?? 'failed'),
            faults: (s.faults as FaultRow[] | undefined) ?? [],
          },
    );
    console.log(JSON.stringify(rows.at(-1)));
    rows.sort((a, b) => a.worldSize - b.worldSize);
    await save();
  }
}
await save();
console.log(markdown(results).join('\n'));

/** The group's samples per second of wall time: every rank's batch per step's total. */
function wallSamplesPerSec(row: StepRow): number | null {
  const total = row.timelineMs?.total;
  return typeof total === 'number' && total > 0 ? (row.worldSize * Number(batchSize) * 1000) / total : null;
}

function markdown(r: Results): string[] {
  const f = (v: number | null | undefined) => (typeof v === 'number' ? (v >= 100 ? v.toFixed(0) : v.toFixed(1)) : '-');
  const lines = [`# Class scale (bench:scale), ${r.machine}`, ''];
  if (r.steps) {
    const keys = ['compute', 'readback', 'waitSlowest', 'wire', 'apply', 'batch', 'vote', 'page', 'other', 'total'];
    lines.push(
      `## Where a step's time goes (${r.steps.date})`,
      '',
      `Train job, synthetic MLP (676 parameters), cpu backend, batch ${batchSize} per rank, 40 steps (the first left out), every rank a headless tab of one Chromium. Mean ms per step, averaged over the ranks. waitSlowest + wire is the exposed all-reduce: wire is the least any rank waited at that step (the last to arrive waits only for the wire). bare: the same float32 all-reduce alone, after training, on the same group (the slowest rank's median). comm / bare = (waitSlowest + wire + vote) / bare.`,
      '',
      'vote: "gradients" rides on the step\'s gradient all-reduce (the default: one meeting point per step), "apart" is an all-gather of its own after the step (`--vote-with-gradients false`); the vote column is then what it costs. Each size runs both ways one after the other.',
      '',
      `| ranks | vote | samples/s (wall) | ${keys.join(' | ')} | bare | comm / bare | wire / bare |`,
      `| ---: | --- | ---: | ${keys.map(() => '---:').join(' | ')} | ---: | ---: | ---: |`,
      ...r.steps.rows.map((row) =>
        row.ok
          ? `| ${row.worldSize} | ${row.vote ?? 'apart'} | ${f(wallSamplesPerSec(row))} | ${keys.map((k) => f(row.timelineMs?.[k])).join(' | ')} | ${f(row.bareAllReduceMs)} | ${f(row.commOverBare)}x | ${f(row.wireOverBare)}x |`
          : `| ${row.worldSize} | ${row.vote ?? 'apart'} | failed: ${row.error} |`,
      ),
      '',
    );
  }
  if (r.churn) {
    const median = (xs: number[]) => (xs.length === 0 ? null : [...xs].sort((p, q) => p - q)[Math.floor(xs.length / 2)]!);
    const fig = (fs: FaultRow[], k: keyof FaultRow) => f(median(fs.map((x) => x[k]).filter((v): v is number => typeof v === 'number')));
    lines.push(
      '## 32 tabs that come and go',
      '',
      `Elastic train job (--min N/2, --max N), synthetic MLP, cpu backend, one epoch; from the first step a tab is killed, one joins, one is frozen, one joins, ... every ${r.churn.everySec} s (\`--churn ${r.churn.everySec}\`). Medians over each kind of fault, in ms. detected: from the fault to a rank noticing (a kill: the peer's socket closing; a freeze: the server's heartbeat timeout, 5 s; a join: the new page's start and the next step's vote). From detection, recovered: until a rank of the new round held the group's state (rendezvous, the round's links, the state transfer); regroup: until a rank of the new round started its next step. Where a run measured them, recovered is followed by its two parts as the first rank of the new round saw them: (rendezvous: from its leaving the last round to the server's next; + links and state). admitted: from a join to its page's first round (a joiner admitted by a round another fault made has no detection of its own). Every fault's figures: scale.json.`,
      '',
      '| ranks | date | ok | seconds | steps | rounds | redone | exactly once | identical | faults | kill: detected / recovered / regroup | freeze: detected / recovered / regroup | join: detected / regroup / admitted |',
      '| ---: | --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | --- | --- |',
      ...r.churn.rows.map((row) => {
        const of = (kind: string) => (row.faults ?? []).filter((x) => x.fault.startsWith(kind));
        const kills = of('kill');
        const freezes = of('freeze');
        const joins = of('open');
        // recovered, and its parts where the run measured them: (rendezvous + links and state).
        const recovered = (fs: FaultRow[]) =>
          `${fig(fs, 'recoveredAfterMs')}${fs.some((x) => x.stateMs !== undefined) ? ` (${fig(fs, 'rendezvousMs')} + ${fig(fs, 'stateMs')})` : ''}`;
        const cells = `${row.faults?.length ?? 0} | ${fig(kills, 'detectedAfterMs')} / ${recovered(kills)} / ${fig(kills, 'regroupMs')} | ${fig(freezes, 'detectedAfterMs')} / ${recovered(freezes)} / ${fig(freezes, 'regroupMs')} | ${fig(joins, 'detectedAfterMs')} / ${fig(joins, 'regroupMs')} / ${fig(joins, 'admittedAfterMs')} |`;
        return row.ok
          ? `| ${row.worldSize} | ${row.date ?? r.churn!.date} | yes | ${f(row.seconds)} | ${row.steps} | ${row.generations} | ${row.stepsRedone} | ${row.exactlyOnce ? 'yes' : 'NO'} | ${row.identical ? 'yes' : 'NO'} | ${cells}`
          : `| ${row.worldSize} | ${row.date ?? r.churn!.date} | failed: ${row.error} | | | | | | | ${cells}`;
      }),
      '',
    );
  }
  return lines;
}
