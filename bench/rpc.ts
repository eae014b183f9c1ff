/**
 * `npm run bench:rpc`: an RPC round trip (a function that returns its argument) against send/recv
 * there and back of the same bytes, between 2 Chromium ranks over WebRTC, with 4 bytes and with
 * 1 MiB (bench/rpc_script.ts). Writes bench/results/rpc.json and rpc.md and prints the table.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({ options: { iters: { type: 'string', default: '50' }, backend: { type: 'string', default: 'cpu' } } });
const { ok, summary } = await launch({
  nproc: 2,
  job: join(PROJECT_ROOT, 'bench', 'rpc_script.ts'),
  scriptArgs: ['--iters', values.iters!],
  session: `bench-rpc-${Date.now().toString(36)}`,
  timeoutSec: 600,
  jobParams: { backend: values.backend! },
});
const s = summary as { roundTrips?: Record<string, { rpcMs: number; sendRecvMs: number }>; errors?: string[] };
if (!ok || !s.roundTrips) {
  console.error(`bench:rpc failed: ${s.errors?.join('; ') ?? 'no figures'}`);
  process.exit(1);
}
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Debian Chromium, 2 ranks on one machine over WebRTC`;
const date = new Date().toISOString().slice(0, 10);
const rows = Object.entries(s.roundTrips).map(([bytes, r]) => ({ bytes: Number(bytes), ...r, ratio: r.rpcMs / r.sendRecvMs }));
const md = [
  `# An RPC round trip against send/recv of the same bytes (${date})`,
  '',
  `Machine: ${machine}. Command: \`npm run bench:rpc -- --iters ${values.iters}\`. Median of ${values.iters} round trips after 5 of warm-up.`,
  '',
  '| bytes each way | RPC round trip (ms) | send + recv back (ms) | RPC / send-recv |',
  '| ---: | ---: | ---: | ---: |',
  ...rows.map((r) => `| ${r.bytes} | ${r.rpcMs.toFixed(2)} | ${r.sendRecvMs.toFixed(2)} | ${r.ratio.toFixed(2)}x |`),
  '',
].join('\n');
console.log(md);
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(join(dir, 'rpc.json'), JSON.stringify({ date, machine, options: values, rows }, null, 2));
await writeFile(join(dir, 'rpc.md'), md);
process.exit(0);
