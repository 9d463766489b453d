// @jobbroker/client: the Node.js client of jobbroker.
export {
  Client,
  defaultAddress,
  defaultWorkerId,
  toEnqueueRequest,
  type BatchJob,
  type ClientOptions,
  type EnqueueOptions,
  type EnqueueResult,
  type FailOptions,
  type LeaseHandle,
  type LeaseOptions,
  type ListJobsOptions,
  type PartialMessage,
} from "./client";
export { Worker, JobContext, type Handler, type WorkerOptions, type WorkerStats } from "./worker";
export {
  JobBrokerError,
  JobCancelledError,
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
export type { QueueInfo, ListJobsResponse, RetryJobResponse } from "./gen/jobbroker/v1/admin";
export { Jitter, type QueuePolicy, type RetryPolicy, type ServerConfig } from "./gen/jobbroker/v1/policy";
export { StepCheckpoint, CompletedStep } from "./gen/jobbroker/v1/steps";
