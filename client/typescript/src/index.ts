// @jobbroker/client: the Node.js client of jobbroker.
export {
  Client,
  defaultAddress,
  defaultWorkerId,
  toEnqueueRequest,
  type BatchJob,
  type CallOptions,
  type ClientOptions,
  type EnqueueAndWaitOptions,
  type EnqueueOptions,
  type EnqueueResult,
  type FailOptions,
  type LeaseHandle,
  type LeaseOptions,
  type ListJobsOptions,
  type PartialMessage,
  type Pem,
  type ScheduleSpec,
} from "./client.js";
export { type EnqueueNext, type ProducerMiddleware } from "./middleware.js";
export { Worker, JobContext, type Handler, type WorkerMiddleware, type WorkerOptions, type WorkerStats } from "./worker.js";
export {
  JobBrokerError,
  JobCancelledError,
  JobEndedError,
  PermanentError,
  RetryAfterError,
  retryAfter,
  SnoozeError,
  snooze,
  Status,
  statusName,
} from "./errors.js";
export { durationFromMs, durationToMs } from "./convert.js";
export { clientName } from "./client.js";
export type { Producer } from "./testing.js";
/** The library's version (the repository's VERSION file, as it was at build time). */
export { version } from "./gen/version.js";
export { StepLog } from "./steps.js";
export { AttemptOutcome, FailReason, JobState, type AttemptRecord, type Job } from "./gen/jobbroker/v1/job.js";
export type { LeasedJob, HeartbeatResponse, FailResponse } from "./gen/jobbroker/v1/broker.js";
export type {
  ClusterInfo,
  ListJobsResponse,
  NodeInfo,
  PartitionInfo,
  QueueInfo,
  RetryJobResponse,
  RunningJob,
  Schedule,
  WorkerInfo,
} from "./gen/jobbroker/v1/admin.js";
export { ScheduleCatchUp } from "./gen/jobbroker/v1/admin.js";
export { Jitter, type QueuePolicy, type RetryPolicy, type ServerConfig } from "./gen/jobbroker/v1/policy.js";
export { StepCheckpoint, CompletedStep } from "./gen/jobbroker/v1/steps.js";
