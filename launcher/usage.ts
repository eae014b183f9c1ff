/**
 * The launcher's usage text (npm run launch -- --help, and after a refused command line). The
 * job options' grammars are printed from their one rule (src/jobs/), not restated here.
 */
import { AGGREGATION_GRAMMAR } from '../src/jobs/aggregation_spec.ts';
import {
  COMM_HOOK_GRAMMAR,
  DEFAULT_COMM_HOOK_START,
  DEFAULT_DILOCO_OUTER_LR,
  DEFAULT_DILOCO_OUTER_MOMENTUM,
} from '../src/jobs/comm_hook_spec.ts';

export const USAGE = `usage: npm run launch -- --nproc N [--min N --max N] [options] SCRIPT.ts [script arguments ...]
       npm run launch -- --nproc N --job NAME [options] [--JOBOPTION VALUE ...]
options: [--server URL] [--session NAME] [--nnodes N --node-rank R (with --server, --session, --token: this machine's --nproc ranks of a world of N x nproc)] [--token TOKEN (or SESSION_TOKEN=...; default: a new one)] [--timeout SECONDS] [--backend webgpu|webgl|wasm|cpu (scripts)]
         [--kill RANK@STEP] [--freeze RANK@STEP] [--lose-device RANK@STEP] [--join N@STEP] [--restart-server STEP] [--heartbeat-timeout MS]
         [--churn SEC (from the first step, every SEC s a tab is killed, one joins, one is frozen, one joins, ...: an elastic run's class; each fault's detection and regroup times in the summary's faults)]
         [--last-call MS (the launcher's own server: once --min tabs are in, the first round waits until MS pass without another arriving, or --max are in; default 5000, torch's last_call_timeout)]
         [--model-dir DIR (the host's own TF.js model) --data-dir DIR|FILE.csv|FILE.txt (its own data: images in a folder per class, a CSV, or a text for --model lm) --label COLUMN (the CSV's label column): offered by the launcher's own server, as npm start's --model/--data/--label; --job train then trains them (--model user, --dataset user)]
         [--slow RANK:FACTOR (repeatable, or RANK:FACTOR,RANK:FACTOR: that rank's compute FACTOR >= 1 times slower, e.g. 3:4 or 1:2.5; --job train and scripts)]
         [--browser chromium|firefox (every rank's browser, --join's pages too; default chromium)] [--browsers B0,B1,... (one browser per rank, as many as --nproc, e.g. chromium,firefox; --join's pages open in Chromium)]
         [--tabs (ranks as tabs of a headful Chromium under xvfb-run, default background throttling)] [--hide RANK@STEP (with --tabs: put that rank's tab in the background)]
         [--intensive-throttling-after SEC (with --tabs: Chrome's one-wake-up-a-minute throttling after SEC s hidden instead of the default minutes)]
         [--lan MBIT (root: every rank its own Chromium in its own network namespace on a virtual LAN, each link MBIT Mbit/s each way)] [--lan-rates R0,R1,... (one rate per rank)] [--lan-delay MS (each host's packets out held MS ms: a round trip between two ranks 2 x MS longer)]
         [--https (its server over TLS with the self-signed certificate kept in certs/; the ranks trust exactly it)] [--server-cert FILE (with --server https://...: its self-signed certificate)]
         [--lan-isolate (with --lan: the ranks cannot reach each other, only the server)] [--turn (with --lan: start a TURN relay, coturn, for the run)]
job train: [--time-limit SEC (every rank asks to stop SEC s after it joined: DDP at the next step, parameter servers when server 0 next answers a worker; then the final evaluation and summary as usual)]
job train, DDP: [--balance true|false (default true: each step's samples split by the ranks' measured speed; false: every rank the same batch, as torch; DDP's only: refused true with --pp or --strategy ps|central)] [--comm-hook ${COMM_HOOK_GRAMMAR} (default none: the gradients' communication hook; START default ${DEFAULT_COMM_HOOK_START}, OUTER_LR ${DEFAULT_DILOCO_OUTER_LR}, MOMENTUM ${DEFAULT_DILOCO_OUTER_MOMENTUM})]
         [--devices K (each rank's batch split over K Workers, each a replica on its own backend: DataParallel; default 1)]
         [--aggregation ${AGGREGATION_GRAMMAR} (default mean; a robust rule keeps a hostile rank from moving every replica: each rank sends its gradient to every other, (N-1)x the gradient; with --comm-hook diloco:H, the outer step's)]
         [--attack scale[:FACTOR]|flip[:FACTOR]|noise[:STD]|alie[:Z] [--attackers K] (for measuring defences only: the last K ranks, default 1, attack their own gradients)]
job train, pipeline parallel: [--pp S (stages, one per rank) [--dp D (replicas of the pipeline, default 1)] [--micro-batches M (per batch, default 4)]]
         a fixed size: --nproc must be S x D (rank = replica x S + stage), and --min/--max, if given, equal it
job train, parameter servers: [--strategy ddp|ps|central (default ddp; ps: asynchronous parameter servers, central: one server, synchronous)]
         [--ps K (with --strategy ps: K server ranks, default 1; --nproc at least K + 1)] [--max-staleness S (ps: drop pushes more than S updates stale)]
         [--staleness-lr (ps: scale each push's gradients by 1/(1 + staleness))]; elastic by default: --min K + 1 unless given, and --kill/--freeze/--join work`;
