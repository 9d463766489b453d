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
} from "./client";
export { type EnqueueNext, type ProducerMiddleware } from "./middleware";
export { Worker, JobContext, type Handler, type WorkerMiddleware, type WorkerOptions, type WorkerStats } from "./worker";
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
} from "./errors";
export { durationFromMs, durationToMs } from "./convert";
export { clientName } from "./client";
export { StepLog } from "./steps";
export { AttemptOutcome, FailReason, JobState, type AttemptRecord, type Job } from "./gen/jobbroker/v1/job";
export type { LeasedJob, HeartbeatResponse, FailResponse } from "./gen/jobbroker/v1/broker";
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
} from "./gen/jobbroker/v1/admin";
export { ScheduleCatchUp } from "./gen/jobbroker/v1/admin";
export { Jitter, type QueuePolicy, type RetryPolicy, type ServerConfig } from "./gen/jobbroker/v1/policy";
export { StepCheckpoint, CompletedStep } from "./gen/jobbroker/v1/steps";
