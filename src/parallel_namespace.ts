/**
 * `parallel`: below DistributedDataParallel and DataParallel (torch.nn.parallel's helpers):
 * gradient buckets, flat weights and their hash, scatter and gather, the devices of a DataParallel.
 */
export { assignBuckets, type Bucket } from './parallel/ddp/buckets.ts';
export { weightsHash, flatTrainableWeights, assignFlatWeights, hostWeights } from './parallel/replicas.ts';
export {
  webWorkerDevice,
  MAX_DEVICES,
  type DeviceChannel,
  type DeviceInfo,
  type DeviceStep,
  type DeviceStats,
} from './parallel/data_parallel/data_parallel.ts';
export { DEVICE_BACKENDS, type DeviceFault } from './parallel/data_parallel/protocol.ts';
export { chunkSizes, scatter, gatherMean, type Chunk } from './parallel/data_parallel/scatter_gather.ts';
