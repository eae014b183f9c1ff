/**
 * `pipeline`: below PipelineStage and runPipeline (torch.distributed.pipelining's helpers): the
 * schedules' actions, the stages' split points, the mesh of stages and replicas.
 */
export { scheduleActions, microBatchSizes, bubbleFraction, peakStashed, SCHEDULES, type Action } from './parallel/pipeline/schedule.ts';
export { describeLayers, balancedSplitPoints, checkSplitPoints, stageRanges, type LayerInfo } from './parallel/pipeline/split.ts';
export { ACTIVATION_DTYPES, type StageStepOptions, type StageStepResult, type TimelineEntry } from './parallel/pipeline/stage.ts';
export { pipelineMesh, meshRank, stagePart, describeMeshFailure, type PipelineMesh } from './parallel/pipeline/runner.ts';
