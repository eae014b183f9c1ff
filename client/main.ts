/**
 * The page. `/?session=NAME&world=N` joins session NAME; `&job=...` runs a job (what the
 * launcher's headless ranks do); without a session it offers to create one.
 */
import { StoreClient, initProcessGroup, type ProcessGroup } from '../src/index.ts';
import { report } from './report.ts';
import { probeWebGpu } from './webgpu.ts';
import type { Job, JobContext } from './jobs/job.ts';
import { rendezvousJob } from './jobs/rendezvous.ts';
import { trainPage } from './train/page.ts';
import { mountCreateForm } from './ui/create_form.ts';
import { allreduceJob } from './jobs/allreduce.ts';
import { collectivesJob } from './jobs/collectives.ts';
import './style.css';

const JOBS: Record<string, Job> = {
  rendezvous: rendezvousJob,
  allreduce: allreduceJob,
  collectives: collectivesJob,
};

const params = new URLSearchParams(location.search);
const app = document.getElementById('app')!;

function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, ...children: Array<Node | string>): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

function intParam(name: string, fallback: number | undefined): number | undefined {
  const raw = params.get(name);
  if (raw === null || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n)) throw new Error(`URL parameter "${name}" must be an integer, got "${raw}"`);
  return n;
}

async function runJob(jobName: string): Promise<void> {
  const job = JOBS[jobName];
  const logList = el('ol', { class: 'log', 'aria-label': 'job log' });
  const status = el('p', { class: 'status', role: 'status' }, `Job "${jobName}": starting…`);
  app.append(el('h1', {}, 'Browser DDP'), status, logList);
  const log = (line: string) => {
    console.log(line);
    logList.append(el('li', {}, line));
  };
  try {
    if (!job) throw new Error(`unknown job "${jobName}"; known jobs: ${Object.keys(JOBS).join(', ')}`);
    const session = params.get('session');
    if (!session) throw new Error('URL parameter "session" is required');
    const ctx: JobContext = {
      params,
      serverUrl: location.origin,
      session,
      worldSize: intParam('world', 1)!,
      rank: intParam('rank', undefined),
      timeoutMs: intParam('timeoutMs', 120_000)!,
      log,
      joined: (rank, worldSize) => {
        status.textContent = `Job "${jobName}": rank ${rank} of ${worldSize}`;
        report({ type: 'rank', rank, worldSize });
      },
      progress: (data) => report({ type: 'progress', data }),
    };
    const result = await job(ctx);
    status.textContent = `Job "${jobName}": done`;
    report({ type: 'result', result });
  } catch (err) {
    const e = err instanceof Error ? err : new Error(String(err));
    status.textContent = `Job "${jobName}" failed: ${e.message}`;
    status.classList.add('error');
    console.error(e);
    report({ type: 'error', name: e.name, message: e.message });
  }
}

/** A person's tab: join, show the rank, who has joined, and WebGPU. */
async function lobby(session: string): Promise<void> {
  const worldSize = intParam('world', undefined);
  const rankEl = el('dd', {}, '…');
  const worldEl = el('dd', {}, worldSize === undefined ? '?' : String(worldSize));
  const membersEl = el('dd', {}, '…');
  const gpuEl = el('dd', {}, 'checking…');
  const status = el('p', { class: 'status', role: 'status' }, 'Connecting…');
  app.append(
    el('h1', {}, `Session “${session}”`),
    status,
    el('dl', { class: 'facts' }, el('dt', {}, 'This tab'), rankEl, el('dt', {}, 'World size'), worldEl, el('dt', {}, 'Joined'), membersEl, el('dt', {}, 'WebGPU'), gpuEl),
  );
  void probeWebGpu().then((g) => {
    gpuEl.textContent = g.available ? `available: ${g.adapter}` : `not available: ${g.reason}`;
    gpuEl.dataset.available = String(g.available);
  });
  if (worldSize === undefined || worldSize < 1) {
    status.textContent = 'Add &world=N to the link: how many tabs will train together.';
    status.classList.add('error');
    return;
  }
  let pg: ProcessGroup;
  try {
    const store = await StoreClient.connect(location.origin, { session });
    store.on('members', (e) => {
      membersEl.textContent = `${e.ranks.length} of ${e.worldSize}: ranks ${e.ranks.join(', ')}`;
      if (pg && e.ranks.length < e.worldSize) status.textContent = `Waiting: ${e.worldSize - e.ranks.length} rank(s) left the group.`;
    });
    store.on('close', () => {
      status.textContent = 'Lost the connection to the server.';
      status.classList.add('error');
    });
    status.textContent = `Waiting for ${worldSize} tabs to join…`;
    pg = await initProcessGroup({ url: location.origin, session, worldSize, rank: intParam('rank', undefined), store, timeoutMs: 3_600_000 });
    rankEl.textContent = `rank ${pg.rank}`;
    status.textContent = `Group complete: ${pg.worldSize} ranks.`;
    status.dataset.complete = 'true';
    report({ type: 'rank', rank: pg.rank, worldSize: pg.worldSize });
  } catch (err) {
    status.textContent = `Could not join: ${(err as Error).message}`;
    status.classList.add('error');
  }
}

const session = params.get('session');
const jobName = params.get('job');
if (jobName === 'train' && session) {
  void trainPage({
    root: app,
    params,
    session,
    worldSize: intParam('world', 1)!,
    rank: intParam('rank', undefined),
    timeoutMs: intParam('timeoutMs', 3_600_000)!,
  });
} else if (jobName) void runJob(jobName);
else if (session) void lobby(session);
else mountCreateForm(app, { origin: location.origin });
