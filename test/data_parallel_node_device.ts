/**
 * A DataParallel device in a Node worker thread (the tests' stand-in for a browser's Worker): the
 * same DeviceReplica, on TF.js's cpu backend, the only one Node has here.
 */
import { parentPort } from 'node:worker_threads';
import type { TransferListItem } from 'node:worker_threads';
import { DeviceReplica } from '../src/parallel/data_parallel/replica.ts';

const port = parentPort!;
const replica = new DeviceReplica(
  (message, transfer = []) => port.postMessage(message, transfer as unknown as TransferListItem[]),
  (backend) => (backend === 'cpu' ? undefined : `no ${backend} in a Node worker thread`),
);
port.on('message', (data: unknown) => void replica.receive(data));
