/**
 * The page. `/?session=NAME&world=N` joins session NAME; `&job=...` runs a job (what the
 * launcher's headless ranks do); without a session it offers to create one.
 */
import { RendezvousHandler } from '../../src/index.ts';
import { StoreClient } from '../../src/c10d/store.ts';
import { UnauthorizedError } from '../../src/wire/errors.ts';
import { report } from '../report.ts';
import { pageAdminSecret, pageToken } from '../page_token.ts';
import { probeWebGpu } from '../webgpu.ts';
import type { Job } from '../jobs/job.ts';
import { runOnPage } from './job_page.ts';
import { rendezvousJob } from '../jobs/rendezvous.ts';
import { trainPage } from './train_page.ts';
import { mountCreateForm } from '../ui/create_form.ts';
import { mountBadLink } from '../ui/bad_link.ts';
import { readLink } from '../ui/link_check.ts';
import { allreduceJob } from '../jobs/allreduce.ts';
import { collectivesJob } from '../jobs/collectives.ts';
import '../style.css';

const JOBS: Record<string, Job> = {
  rendezvous: rendezvousJob,
  allreduce: allreduceJob,
  collectives: collectivesJob,
};

const params = new URLSearchParams(location.search);
const app = document.getElementById('app')!;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: Array<Node | string>
): HTMLElementTagNameMap[K] {
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
  await runOnPage(app, `Job "${jobName}"`, (page) => {
    const job = JOBS[jobName];
    if (!job) throw new Error(`unknown job "${jobName}"; known jobs: ${Object.keys(JOBS).join(', ')}`);
    const session = params.get('session');
    if (!session) throw new Error('URL parameter "session" is required');
    return job({
      params,
      serverUrl: location.origin,
      session,
      token: pageToken(),
      worldSize: intParam('world', 1)!,
      rank: intParam('rank', undefined),
      timeoutMs: intParam('timeoutMs', 120_000)!,
      log: page.log,
      joined: (rank, worldSize) => {
        page.status(`rank ${rank} of ${worldSize}`);
        report({ type: 'rank', rank, worldSize });
      },
    });
  });
}

/** A person's tab: join, show the rank, how many have joined, and WebGPU. */
async function lobby(session: string, worldSize: number | undefined, rank: number | undefined): Promise<void> {
  const rankEl = el('dd', {}, '…');
  const worldEl = el('dd', {}, worldSize === undefined ? '?' : String(worldSize));
  const membersEl = el('dd', {}, '…');
  const gpuEl = el('dd', {}, 'checking…');
  const status = el('p', { class: 'status', role: 'status' }, 'Connecting…');
  app.append(
    el('h1', {}, `Session “${session}”`),
    status,
    el(
      'dl',
      { class: 'facts' },
      el('dt', {}, 'This tab'),
      rankEl,
      el('dt', {}, 'World size'),
      worldEl,
      el('dt', {}, 'Joined'),
      membersEl,
      el('dt', {}, 'WebGPU'),
      gpuEl,
    ),
  );
  void probeWebGpu().then((g) => {
    gpuEl.textContent = g.available ? `available: ${g.adapter}` : `not available: ${g.reason}`;
    gpuEl.dataset.available = String(g.available);
  });
  if (worldSize === undefined) {
    status.textContent = 'Add &world=N to the link: how many tabs will train together.';
    status.classList.add('error');
    return;
  }
  try {
    status.textContent = `Waiting for ${worldSize} tabs to join…`;
    const handler = await RendezvousHandler.start(
      { url: location.origin, session, token: pageToken(), min: worldSize, max: worldSize, rank, timeoutMs: 3_600_000 },
      (e) => {
        if (e.type === 'waiting') membersEl.textContent = `${e.members} of ${worldSize}`;
        if (e.type === 'paused') status.textContent = 'Waiting: a tab left the group.';
      },
    );
    handler.store.on('close', () => {
      status.textContent = 'Lost the connection to the server.';
      status.classList.add('error');
    });
    for (let after = 0; ; ) {
      const round = await handler.nextRendezvous(after, 3_600_000);
      after = round.id;
      rankEl.textContent = `rank ${round.rank}`;
      membersEl.textContent = `${round.worldSize} of ${worldSize}: ranks ${Array.from({ length: round.worldSize }, (_, r) => r).join(', ')}`;
      status.textContent = `Group complete: ${round.worldSize} ranks.`;
      status.dataset.complete = 'true';
      report({ type: 'rank', rank: round.rank, worldSize: round.worldSize });
    }
  } catch (err) {
    status.textContent = `Could not join: ${(err as Error).message}`;
    status.classList.add('error');
  }
}

// A page restored from the back/forward cache would run on with its connections to the server
// and its peers closed (the library closes them on pagehide): load it anew, so it joins again.
addEventListener('pageshow', (e) => {
  if (e.persisted) location.reload();
});

// Every link is read before anything runs: a bad value gets a page that says which and what to
// do, never a blank page or a run that "failed".
const link = readLink(params, Object.keys(JOBS));
switch (link.kind) {
  case 'bad':
    mountBadLink(app, link.problem);
    console.error(`${link.problem.title}: ${link.problem.message}`);
    // The launcher's pages must hear of it too, or it would wait for a result until its timeout.
    report({ type: 'error', name: 'LinkError', message: link.problem.message });
    break;
  case 'train':
    void trainPage({ root: app, params, session: link.session, rank: link.rank, timeoutMs: link.timeoutMs });
    break;
  case 'job':
    void runJob(link.job);
    break;
  case 'lobby':
    void lobby(link.session, link.world, link.rank);
    break;
  case 'create':
    mountCreateForm(app, { origin: location.origin, register: createSession });
    break;
}

/**
 * Creates a session on the server from the create form: a hello with its new token and host
 * secret (and the admin secret of an admin link), then the socket closes; the session stays.
 */
async function createSession(session: string, token: string, host: string): Promise<void> {
  const admin = pageAdminSecret();
  let client: StoreClient;
  try {
    client = await StoreClient.connect(location.origin, { session, token, host, ...(admin ? { admin } : {}) });
  } catch (err) {
    if (err instanceof UnauthorizedError && /wrong token/.test(err.message))
      throw new Error(`A session named “${session}” exists on this server already: choose another name.`);
    if (err instanceof UnauthorizedError)
      throw new Error(
        `Only the host creates sessions on this server: open the start page on the server's own computer, or the admin link npm start printed. (${err.message})`,
      );
    throw new Error(`The server did not create the session: ${(err as Error).message}`);
  }
  client.close();
}
