//! The worker helper: `docs/worker-contract.md` on Tokio and tonic.
//!
//! A [`Worker`] turns the broker's `Work` stream into calls of `async` handlers, one per queue:
//!
//! ```no_run
//! use jobbroker::{Job, Worker, WorkerError};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let mut worker = Worker::builder("127.0.0.1:7070").concurrency(4).build()?;
//!     worker.handle("emails", |job: Job| async move {
//!         let to: String = job.json()?;
//!         if to.is_empty() {
//!             return Err(WorkerError::permanent("no recipient"));
//!         }
//!         Ok(format!("sent to {to}"))
//!     });
//!     worker.run_until_signal().await?; // SIGTERM / SIGINT: graceful stop
//!     Ok(())
//! }
//! ```
//!
//! # How it is built
//!
//! Three kinds of task share the work, so that no slow request ever holds up another:
//!
//! * the **run loop** ([`Worker::run`]) owns the held jobs: it routes pushed jobs, lease-lost and
//!   cancel notices, starts handlers in arrival order when a slot is free, and drives the
//!   graceful stop;
//! * the **connection task** holds one `Work` stream per group of the handled queues: in a
//!   cluster, one per node that leads some of their partitions (`docs/worker-contract.md` §5,
//!   "One stream per leading node"), else one. A **stream task** per group opens its stream and
//!   forwards what it pushes; when one ends (also during a graceful stop, until the streams are
//!   closed), the connection task waits the backoff, asks for the cluster's layout again and
//!   regroups; while a group goes to any node (a partition without a leader), it does so after
//!   each backoff delay as well. The open streams are published in a `watch` channel that every
//!   sender reads;
//! * one **job task** per held job: it heartbeats the lease (also while the job waits for a
//!   slot), fires the job's [`CancellationToken`] at its time-out, runs the handler in a task of
//!   its own (so a panic is only that attempt's failure) and sends the answer, on the stream that
//!   pushed the job while it is open, else on any open one. Acks go through the **ack
//!   coalescer**, which keeps one ack message in flight per stream and batches those that end
//!   meanwhile.
//!
//! Every answer is sent "until answered": when its stream breaks before the result arrives it is
//! sent again, with the same lease id, on another stream (the broker answers a repeated ack of
//! the same attempt OK, and a stale one `FAILED_PRECONDITION`, which is logged and final).
//!
//! # Cancellation
//!
//! Each job's [`CancellationToken`] fires on an operator cancel, a lost lease, its time-out
//! (`LeasedJob.timeout_at`) and the end of a graceful stop's grace; [`Job::cancel_reason`] says
//! which. The helper cannot stop code that ignores the token, and `concurrency` is a hard bound:
//! a cancelled, timed-out or abandoned handler that keeps running holds its slot until it
//! returns, and no other handler starts in its place meanwhile (a handler stuck in a blocking
//! call would otherwise pile up a new one per time-out). A worker whose slots are all stuck shows
//! in `Admin.ListWorkers` and the dashboard.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;

use crate::middleware::{self, HandlerNext, WorkerMiddleware};
use crate::routing_table::StreamGroup;
use crate::v1::{self, work_request::Request};
use crate::{
    CancelOnDrop, Client, ClientOptions, Code, ConnectError, Status, WorkEvent, WorkStream,
    duration,
};

/// Reconnect backoff: from this, doubling per failed try (full jitter) ...
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// ... up to this.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long an ack, fail, release or step save the broker answered `UNAVAILABLE` (a partition
/// between leaders: "retry") waits before it is sent again (unless the stream ends first: then
/// it goes out on the next one).
const ANSWER_RETRY_DELAY: Duration = Duration::from_millis(250);
/// The most acks one `ack_batch` may carry (AckBatchRequest).
const MAX_ACK_BATCH: usize = 1000;
/// How long handlers cancelled at the end of a graceful stop's grace may take to return before
/// their jobs are released anyway ...
const RETURN_AFTER_GRACE: Duration = Duration::from_secs(1);
/// ... and how long the answers may take after that.
const ANSWERS_AFTER_RETURNS: Duration = Duration::from_secs(1);
/// How long a half-closed stream may take to end before the call is cancelled.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Heartbeats never go out more often than this, whatever a lease's length.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(50);

/// How a handler (or a step) ends other than with a result. Its variant decides what the
/// helper tells the broker:
///
/// | variant | the broker is sent | the job |
/// |---|---|---|
/// | [`Permanent`](WorkerError::Permanent) | `fail`, `permanent` | FAILED, `FAIL_REASON_PERMANENT` |
/// | [`RetryAfter`](WorkerError::RetryAfter) | `fail`, `retry_after` | SCHEDULED after the delay |
/// | [`Snooze`](WorkerError::Snooze) | `release` with the delay | SCHEDULED, no attempt spent |
/// | [`Cancelled`](WorkerError::Cancelled), [`Other`](WorkerError::Other) | `fail` with its text | retried after the queue's backoff |
///
/// After the job's cancellation fired, the cause of the cancellation decides instead (see
/// [`CancelReason`]).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// No retry: the job fails for good with this message.
    #[error("{0}")]
    Permanent(String),
    /// Retry after `delay` instead of the queue's backoff (e.g. a provider's Retry-After).
    #[error("{message} (retry after {delay:?})")]
    RetryAfter {
        /// How long the broker waits before the next attempt.
        delay: Duration,
        /// Kept in the attempt history.
        message: String,
    },
    /// Give the job back unstarted, to run again this much later; no attempt is spent.
    #[error("snoozed for {0:?}")]
    Snooze(Duration),
    /// The handler stopped because its [`CancellationToken`] fired.
    #[error("cancelled")]
    Cancelled,
    /// Any other failure: the attempt fails and the queue's backoff decides the retry.
    #[error("{0}")]
    Other(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl WorkerError {
    /// [`WorkerError::Permanent`] with `message`.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::Permanent(message.into())
    }

    /// [`WorkerError::RetryAfter`]: retry after `delay`, keeping `message`.
    pub fn retry_after(delay: Duration, message: impl Into<String>) -> Self {
        Self::RetryAfter {
            delay,
            message: message.into(),
        }
    }

    /// [`WorkerError::Snooze`] for `delay`.
    pub fn snooze(delay: Duration) -> Self {
        Self::Snooze(delay)
    }

    /// [`WorkerError::Other`] from any error or message (`&str` and `String` work).
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self::Other(error.into())
    }
}

impl From<std::io::Error> for WorkerError {
    fn from(error: std::io::Error) -> Self {
        Self::other(error)
    }
}

impl From<serde_json::Error> for WorkerError {
    fn from(error: serde_json::Error) -> Self {
        Self::other(error)
    }
}

impl From<Status> for WorkerError {
    fn from(status: Status) -> Self {
        Self::other(status)
    }
}

/// Why [`Worker::run`] (or building a worker) failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// [`Worker::handle`] was never called: there is no queue to subscribe to.
    #[error("no handler registered: call Worker::handle before running")]
    NoHandlers,
    /// The [`ClientOptions`] cannot work (a malformed address, an unreadable certificate file,
    /// a certificate without TLS, a token that cannot be sent).
    #[error("{0}")]
    Options(#[from] ConnectError),
    /// The broker refused the stream with a code that retrying would not change
    /// (`INVALID_ARGUMENT` for a bad queue name, `UNAUTHENTICATED`, `PERMISSION_DENIED`, ...).
    #[error("the broker refused the work stream: {0}")]
    Refused(Status),
    /// SIGTERM / SIGINT handlers could not be installed.
    #[error("cannot listen for SIGTERM/SIGINT: {0}")]
    Signals(#[source] std::io::Error),
}

/// A job's result: the bytes kept with the completed job. Handlers return anything that turns
/// into one: bytes as they are, text as UTF-8, a [`serde_json::Value`] as JSON, `()` as empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output(pub Vec<u8>);

impl Output {
    /// Any serializable value as JSON.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Self, WorkerError> {
        Ok(Self(serde_json::to_vec(value)?))
    }
}

impl From<Vec<u8>> for Output {
    fn from(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
}

impl From<&[u8]> for Output {
    fn from(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }
}

impl From<String> for Output {
    fn from(text: String) -> Self {
        Self(text.into_bytes())
    }
}

impl From<&str> for Output {
    fn from(text: &str) -> Self {
        Self(text.as_bytes().to_vec())
    }
}

impl From<()> for Output {
    fn from((): ()) -> Self {
        Self(Vec::new())
    }
}

impl From<serde_json::Value> for Output {
    fn from(value: serde_json::Value) -> Self {
        // Serializing a Value cannot fail: its map keys are strings.
        Self(serde_json::to_vec(&value).unwrap_or_default())
    }
}

/// Why a job's [`CancellationToken`] fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// An operator cancelled the job (`Admin.CancelJob`). Whatever error the handler ends with,
    /// the helper fails the attempt with "cancelled"; the job stays CANCELLED.
    Operator,
    /// The lease ran out (no heartbeat in time) and the broker ended the attempt. Nothing the
    /// handler ends with is sent.
    LeaseLost,
    /// The attempt reached its run-time limit (`timeout_at`); the broker ends it TIMED_OUT.
    /// Nothing the handler ends with is sent.
    TimedOut,
    /// A graceful stop's grace ran out. Whatever the handler ends with, the job is released:
    /// READY again, no attempt spent.
    Shutdown,
}

impl CancelReason {
    /// True when the broker already ended the attempt, so no answer is sent.
    fn ends_lease(self) -> bool {
        matches!(self, Self::LeaseLost | Self::TimedOut)
    }
}

/// One held lease: what the run loop, the job's task and its [`Job`] share.
struct Held {
    job_id: String,
    lease_id: String,
    token: CancellationToken,
    /// The attempt's run-time limit, if any.
    timeout_at: Option<SystemTime>,
    /// The first reason the token fired for, except that a reason that ends the lease replaces
    /// any other (once the lease is gone, nothing may be sent for it).
    reason: Mutex<Option<CancelReason>>,
    progress: Mutex<ProgressState>,
}

#[derive(Default)]
struct ProgressState {
    /// A progress heartbeat is waiting for its result.
    sending: bool,
    /// The newest value reported meanwhile; the ones before it are dropped.
    newest: Option<Vec<u8>>,
}

impl Held {
    fn new(job: &v1::LeasedJob) -> Self {
        Self {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            token: CancellationToken::new(),
            timeout_at: job.timeout_at.as_ref().map(system_time),
            reason: Mutex::new(None),
            progress: Mutex::new(ProgressState::default()),
        }
    }

    fn fire(&self, why: CancelReason) {
        let mut reason = self.reason.lock().unwrap();
        let replace = match *reason {
            None => true,
            Some(old) => why.ends_lease() && !old.ends_lease(),
        };
        if replace {
            *reason = Some(why);
        }
        drop(reason);
        self.token.cancel();
    }

    /// The broker says the lease ended. Past the time-out, that is the time-out (the broker's
    /// `lease_lost` can beat the helper's own timer, and the handler should hear the same
    /// reason either way).
    fn lease_lost(&self) {
        let timed_out = self.timeout_at.is_some_and(|t| SystemTime::now() >= t);
        self.fire(if timed_out {
            CancelReason::TimedOut
        } else {
            CancelReason::LeaseLost
        });
    }

    fn reason(&self) -> Option<CancelReason> {
        *self.reason.lock().unwrap()
    }

    fn lease_gone(&self) -> bool {
        self.reason().is_some_and(CancelReason::ends_lease)
    }

    /// Applies a heartbeat's answer: an operator cancel, or a lease the broker no longer has.
    fn heard(&self, answer: &Result<v1::WorkResult, Status>) {
        match answer {
            Ok(result) if result.cancel_requested => self.fire(CancelReason::Operator),
            Err(status) if is_stale(status) => self.lease_lost(),
            _ => {}
        }
    }

    fn heartbeat(&self, checkpoint: Option<Vec<u8>>, progress: Option<Vec<u8>>) -> Request {
        Request::Heartbeat(v1::HeartbeatRequest {
            job_id: self.job_id.clone(),
            lease_id: self.lease_id.clone(),
            extend_by: None,
            checkpoint,
            progress,
        })
    }
}

/// The worker's open streams, as the connection task publishes them; every sender reads it.
type OpenStreams = watch::Receiver<Vec<WorkStream>>;

/// Where a job's requests go (`docs/worker-contract.md` §5): on the stream that pushed it while
/// that stream is open, else on any open stream of the worker (a node routes a job's answer to
/// its leader by job id), else on the next stream that opens.
#[derive(Clone)]
struct AnswerRoute {
    /// The stream that pushed the job.
    home: Option<WorkStream>,
    open: OpenStreams,
}

impl AnswerRoute {
    /// The stream to send on now, if one is open (without waiting).
    fn now(&self) -> Option<WorkStream> {
        if let Some(home) = &self.home
            && home.takes_requests()
        {
            return Some(home.clone());
        }
        self.open
            .borrow()
            .iter()
            .find(|s| s.takes_requests())
            .cloned()
    }

    /// Waits for an open stream; `None` once the worker has stopped for good.
    async fn wait(&mut self) -> Option<WorkStream> {
        loop {
            self.open.borrow_and_update();
            if let Some(stream) = self.now() {
                return Some(stream);
            }
            self.open.changed().await.ok()?;
        }
    }

    /// After an answer refused with `UNAVAILABLE`: waits [`ANSWER_RETRY_DELAY`], or less if the
    /// worker's streams change first (the answer then goes out on the stream it finds).
    async fn wait_to_resend(&mut self) {
        tokio::select! {
            () = tokio::time::sleep(ANSWER_RETRY_DELAY) => {}
            _ = self.open.changed() => {}
        }
    }
}

/// Sends `request` until the broker answers it: on another stream when this one ends first,
/// again after [`ANSWER_RETRY_DELAY`] when the broker answers `UNAVAILABLE` (not final: the
/// partition is between leaders). Any other answer is returned.
async fn send_until_answered(
    mut route: AnswerRoute,
    request: Request,
) -> Result<v1::WorkResult, Status> {
    loop {
        let Some(stream) = route.wait().await else {
            return Err(Status::unavailable(
                "the worker stopped before the broker answered",
            ));
        };
        match stream.request(request.clone()).await {
            Ok(result) => return Ok(result),
            // The stream ended (or a regrouping half-closed it) first: the broker may or may
            // not have applied it, and a repeat with the same lease id is safe either way.
            Err(_) if !stream.takes_requests() => {}
            Err(status) if status.code() == Code::Unavailable => route.wait_to_resend().await,
            Err(status) => return Err(status),
        }
    }
}

/// The answers that say a lease is gone: final, logged, never an error of the worker.
fn is_stale(status: &Status) -> bool {
    matches!(status.code(), Code::FailedPrecondition | Code::NotFound)
}

/// The stream ends after which the helper reopens it; others end [`Worker::run`].
fn reconnectable(code: Code) -> bool {
    matches!(
        code,
        Code::Ok
            | Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
    )
}

/// A uniformly random duration in [0, max]: full jitter, so that workers cut off together do
/// not reconnect together.
fn full_jitter(max: Duration) -> Duration {
    let random = RandomState::new().hash_one(Instant::now());
    max.mul_f64((random % 10_001) as f64 / 10_000.0)
}

fn system_time(t: &prost_types::Timestamp) -> SystemTime {
    UNIX_EPOCH + Duration::new(t.seconds.max(0) as u64, t.nanos.max(0) as u32)
}

/// The monotonic instant of a broker timestamp (now, if it is already past).
fn instant_at(t: &prost_types::Timestamp) -> Instant {
    let left = system_time(t)
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    Instant::now() + left
}

/// A third of what is left of a lease that runs out at `deadline`.
fn third_of_lease(deadline: Option<&prost_types::Timestamp>) -> Duration {
    let left = deadline
        .map(|d| {
            system_time(d)
                .duration_since(SystemTime::now())
                .unwrap_or_default()
        })
        .unwrap_or(Duration::from_secs(30));
    (left / 3).max(MIN_HEARTBEAT_INTERVAL)
}

/// Aborts a task when dropped, so helper tasks never outlive the job or worker they serve.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One attempt of a job, as a handler sees it. Cheap to clone; clones share the cancellation
/// token and the durable steps' state.
#[derive(Clone)]
pub struct Job {
    inner: Arc<JobInner>,
}

struct JobInner {
    leased: v1::LeasedJob,
    held: Arc<Held>,
    route: AnswerRoute,
    /// The durable steps' state, read from the checkpoint on first use; `Err` says why the
    /// checkpoint is not one of durable steps.
    steps: Mutex<Option<Result<Steps, String>>>,
    /// Saves one checkpoint at a time, so a later save never overtakes an earlier one.
    saving: tokio::sync::Mutex<()>,
}

struct Steps {
    checkpoint: v1::StepCheckpoint,
    /// Names used in this attempt (a repeated one is an error of the handler).
    used: HashSet<String>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id())
            .field("queue", &self.queue())
            .field("attempt", &self.attempt())
            .finish_non_exhaustive()
    }
}

impl Job {
    fn new(leased: v1::LeasedJob, held: Arc<Held>, route: AnswerRoute) -> Self {
        Self {
            inner: Arc::new(JobInner {
                leased,
                held,
                route,
                steps: Mutex::new(None),
                saving: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The job's id.
    pub fn id(&self) -> &str {
        &self.inner.leased.job_id
    }

    /// The queue it came from (the one its handler was registered for).
    pub fn queue(&self) -> &str {
        &self.inner.leased.queue
    }

    /// The payload as enqueued.
    pub fn payload(&self) -> &[u8] {
        &self.inner.leased.payload
    }

    /// The payload as UTF-8 text; a permanent error if it is not (a retry would not fix it).
    pub fn text(&self) -> Result<&str, WorkerError> {
        std::str::from_utf8(self.payload())
            .map_err(|e| WorkerError::permanent(format!("payload is not UTF-8: {e}")))
    }

    /// The payload decoded from JSON; a permanent error if it does not decode.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, WorkerError> {
        serde_json::from_slice(self.payload())
            .map_err(|e| WorkerError::permanent(format!("payload is not the JSON expected: {e}")))
    }

    /// The headers as enqueued.
    pub fn headers(&self) -> &HashMap<String, String> {
        &self.inner.leased.headers
    }

    /// 1 for the first attempt.
    pub fn attempt(&self) -> i32 {
        self.inner.leased.attempt
    }

    /// Attempts allowed in total; `attempt() == max_attempts()` is the last chance.
    pub fn max_attempts(&self) -> i32 {
        self.inner.leased.max_attempts
    }

    /// The same for every attempt: hand it to side effects' providers.
    pub fn idempotency_key(&self) -> &str {
        &self.inner.leased.idempotency_key
    }

    /// When the broker accepted the job.
    pub fn enqueued_at(&self) -> Option<SystemTime> {
        self.inner.leased.enqueued_at.as_ref().map(system_time)
    }

    /// When the lease runs out unless heartbeats (which the helper sends) extend it; as the
    /// job arrived.
    pub fn lease_deadline(&self) -> Option<SystemTime> {
        self.inner.leased.lease_deadline.as_ref().map(system_time)
    }

    /// When this attempt times out (its token fires then), if it has a run-time limit.
    pub fn timeout_at(&self) -> Option<SystemTime> {
        self.inner.leased.timeout_at.as_ref().map(system_time)
    }

    /// The results of the jobs it depended on, by job id.
    pub fn dependency_results(&self) -> &HashMap<String, Vec<u8>> {
        &self.inner.leased.dependency_results
    }

    /// What an earlier attempt saved (the durable steps' `StepCheckpoint`); empty if none.
    pub fn checkpoint(&self) -> &[u8] {
        &self.inner.leased.checkpoint
    }

    /// The job as the broker pushed it.
    pub fn leased(&self) -> &v1::LeasedJob {
        &self.inner.leased
    }

    /// Fires on operator cancel, lost lease, time-out or the end of a graceful stop's grace.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.held.token.clone()
    }

    /// Completes when the cancellation token fires.
    pub async fn cancelled(&self) {
        self.inner.held.token.cancelled().await
    }

    /// True once the cancellation token fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.held.token.is_cancelled()
    }

    /// Why the cancellation token fired; `None` while it has not.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.inner.held.reason()
    }

    /// Reports progress (`value` as JSON, e.g. `{"percent": 40}`), shown by `Admin.WatchJob`
    /// and the dashboard. Sent at once; while one report waits for its answer, only the newest
    /// of those made meanwhile goes out after it.
    pub fn progress<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), WorkerError> {
        let value = serde_json::to_vec(value)?;
        let held = self.inner.held.clone();
        {
            let mut state = held.progress.lock().unwrap();
            if state.sending {
                state.newest = Some(value);
                return Ok(());
            }
            state.sending = true;
        }
        let route = self.inner.route.clone();
        tokio::spawn(async move {
            let mut value = value;
            loop {
                let answer =
                    send_until_answered(route.clone(), held.heartbeat(None, Some(value))).await;
                held.heard(&answer);
                let mut state = held.progress.lock().unwrap();
                match state.newest.take() {
                    Some(newer) if answer.is_ok() => value = newer,
                    _ => {
                        state.sending = false;
                        return;
                    }
                }
            }
        });
        Ok(())
    }

    /// Runs `body` as the durable step `name`: at most once per job across attempts and
    /// workers, as long as its result could be saved. The first time, `body` runs and its
    /// result is saved as JSON in the job's checkpoint (a `jobbroker.v1.StepCheckpoint`, which
    /// workers in every language read) before `step` returns. An attempt that finds `name`
    /// there returns the saved result without running `body`. Either way the value is the one
    /// JSON gives back, so a first run and a resumed one see the same.
    ///
    /// Errors: `body`'s own; a save the broker refused (the lease is gone: return the error);
    /// `name` used twice in one attempt; a checkpoint not written by durable steps.
    pub async fn step<T, F>(&self, name: &str, body: F) -> Result<T, WorkerError>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, WorkerError>>,
    {
        if let Some(saved) = self.begin_step(name)? {
            return serde_json::from_slice(&saved).map_err(|e| {
                WorkerError::other(format!(
                    "step {name:?}: cannot decode its saved result: {e}"
                ))
            });
        }
        let value = body.await?;
        let result = serde_json::to_vec(&value)?;
        self.save_step(name, result.clone()).await?;
        serde_json::from_slice(&result).map_err(|e| {
            WorkerError::other(format!(
                "step {name:?}: its result does not decode from its own JSON: {e}"
            ))
        })
    }

    /// The saved result of step `name`, if any; marks the name used in this attempt.
    fn begin_step(&self, name: &str) -> Result<Option<Vec<u8>>, WorkerError> {
        let mut steps = self.inner.steps.lock().unwrap();
        let steps = steps.get_or_insert_with(|| read_step_checkpoint(self.checkpoint()));
        let steps = match steps {
            Ok(steps) => steps,
            Err(why) => {
                return Err(WorkerError::other(format!(
                    "job {} has a checkpoint that is not a jobbroker.v1.StepCheckpoint ({why}): \
                     was it saved by something other than durable steps?",
                    self.id()
                )));
            }
        };
        if !steps.used.insert(name.to_string()) {
            return Err(WorkerError::other(format!(
                "step {name:?} used twice in one attempt of job {}: step names must be unique",
                self.id()
            )));
        }
        Ok(steps
            .checkpoint
            .steps
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.result.clone()))
    }

    /// Adds step `name` to the checkpoint and saves the whole checkpoint with a heartbeat now.
    async fn save_step(&self, name: &str, result: Vec<u8>) -> Result<(), WorkerError> {
        let _one_save_at_a_time = self.inner.saving.lock().await;
        let data = {
            let mut steps = self.inner.steps.lock().unwrap();
            let Some(Ok(steps)) = steps.as_mut() else {
                unreachable!("begin_step loaded the steps");
            };
            steps.checkpoint.steps.push(v1::CompletedStep {
                name: name.to_string(),
                result,
            });
            steps.checkpoint.encode_to_vec()
        };
        let held = &self.inner.held;
        let answer =
            send_until_answered(self.inner.route.clone(), held.heartbeat(Some(data), None)).await;
        held.heard(&answer);
        answer.map(|_| ()).map_err(|status| {
            WorkerError::other(format!(
                "step {name:?} finished but its result could not be saved: {status}"
            ))
        })
    }
}

/// Reads a checkpoint by the rules of steps.proto: unknown fields are ignored; a non-empty
/// checkpoint that does not parse, holds no step, has an empty or repeated name or a result
/// that is not JSON was written by something else.
fn read_step_checkpoint(data: &[u8]) -> Result<Steps, String> {
    let mut steps = Steps {
        checkpoint: v1::StepCheckpoint::default(),
        used: HashSet::new(),
    };
    if data.is_empty() {
        return Ok(steps);
    }
    steps.checkpoint = v1::StepCheckpoint::decode(data).map_err(|e| e.to_string())?;
    if steps.checkpoint.steps.is_empty() {
        return Err("it holds no step".into());
    }
    let mut names = HashSet::new();
    for step in &steps.checkpoint.steps {
        if step.name.is_empty() || !names.insert(step.name.as_str()) {
            return Err(format!("bad or repeated step name {:?}", step.name));
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(&step.result).is_err() {
            return Err(format!(
                "step {:?} has a result that is not JSON",
                step.name
            ));
        }
    }
    Ok(steps)
}

type HandlerFuture = crate::middleware::BoxFuture<Result<Output, WorkerError>>;
pub(crate) type Handler = Arc<dyn Fn(Job) -> HandlerFuture + Send + Sync>;

/// Options of a [`Worker`]; see [`Worker::builder`].
#[derive(Debug)]
pub struct WorkerBuilder {
    options: ClientOptions,
    client: Option<Client>,
    concurrency: usize,
    prefetch: usize,
    lease: Option<Duration>,
    grace: Duration,
    worker_id: Option<String>,
}

impl WorkerBuilder {
    /// Handlers running at once. Default 1; at least 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Jobs held beyond `concurrency`: leased and heartbeated, started in arrival order when a
    /// slot frees up. Default 0.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// The lease asked for each job; default: the job's, else the queue's.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long running handlers may still finish after a graceful stop began, before their
    /// tokens fire. Default 30 s.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The name in the jobs' attempt histories and `Admin.ListWorkers`; default `<host>-<pid>`.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// Sends `authorization: Bearer <token>` on every call (a broker with `--auth-tokens`;
    /// the token needs the `worker` role on the handlers' queues): the same as
    /// [`ClientOptions::token`].
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.options = self.options.token(token);
        self
    }

    /// Uses this client (and its options) instead of making one from the builder's options.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The worker, with no handler yet. Connects on [`Worker::run`], not now; fails only for
    /// options that cannot work ([`RunError::Options`]).
    pub fn build(self) -> Result<Worker, RunError> {
        let client = match self.client {
            Some(client) => client,
            None => Client::new(self.options)?,
        };
        Ok(Worker {
            client,
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            lease: self.lease,
            grace: self.grace,
            worker_id: self.worker_id.unwrap_or_else(default_worker_id),
            handlers: HashMap::new(),
            middleware: Vec::new(),
            shutdown: CancellationToken::new(),
        })
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}-{}", std::process::id())
}

/// Starts a graceful stop of the [`Worker`] it came from; cheap to clone, callable from any
/// task or thread, any number of times.
#[derive(Clone, Debug)]
pub struct ShutdownHandle(CancellationToken);

impl ShutdownHandle {
    /// Begins the graceful stop (idempotent); [`Worker::run`] returns once it is done.
    pub fn shutdown(&self) {
        self.0.cancel();
    }
}

/// The worker helper of `docs/worker-contract.md`: handlers per queue over `Work` streams (one
/// per leading node in a cluster, else one).
/// See the module documentation for an example and how it works.
pub struct Worker {
    client: Client,
    concurrency: usize,
    prefetch: usize,
    lease: Option<Duration>,
    grace: Duration,
    worker_id: String,
    handlers: HashMap<String, Handler>,
    middleware: Vec<WorkerMiddleware>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.worker_id)
            .field("queues", &self.handlers.keys().collect::<Vec<_>>())
            .field("concurrency", &self.concurrency)
            .field("prefetch", &self.prefetch)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Options for a worker that reaches the broker with `options`: a [`ClientOptions`] (TLS,
    /// token, several addresses, ...) or just an address (`host:port`, `http://host:port`).
    pub fn builder(options: impl Into<ClientOptions>) -> WorkerBuilder {
        WorkerBuilder {
            options: options.into(),
            client: None,
            concurrency: 1,
            prefetch: 0,
            lease: None,
            grace: Duration::from_secs(30),
            worker_id: None,
        }
    }

    /// Registers `handler` for `queue` (replacing an earlier one); the worker subscribes to the
    /// queues that have one. The handler's `Ok` value is the job's result ([`Output`]); its
    /// error decides the retry ([`WorkerError`]). A panic is the attempt's failure.
    pub fn handle<F, Fut, R>(&mut self, queue: impl Into<String>, handler: F) -> &mut Self
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, WorkerError>> + Send + 'static,
        R: Into<Output>,
    {
        let handler: Handler = Arc::new(move |job| {
            let running = handler(job);
            Box::pin(async move { running.await.map(Into::into) })
        });
        self.handlers.insert(queue.into(), handler);
        self
    }

    /// Adds a middleware around every handler call, inside those added before: the first
    /// added is the outermost. It gets the job and `next`; `next.run(job).await` runs the rest
    /// of the chain and the handler. Not calling it skips the handler, and the middleware's own
    /// result is the job's. It runs in the handler's task: a panic there is the attempt's
    /// failure too.
    ///
    /// ```
    /// # fn demo(worker: &mut jobbroker::Worker) {
    /// use std::time::Instant;
    /// worker.use_middleware(|job, next| async move {
    ///     let (id, started) = (job.id().to_string(), Instant::now());
    ///     let outcome = next.run(job).await;
    ///     eprintln!("job {id}: {:?} after {:?}", outcome.is_ok(), started.elapsed());
    ///     outcome
    /// });
    /// # }
    /// ```
    pub fn use_middleware<F, Fut>(&mut self, middleware: F) -> &mut Self
    where
        F: Fn(Job, HandlerNext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Output, WorkerError>> + Send + 'static,
    {
        self.middleware
            .push(Arc::new(move |job, next| Box::pin(middleware(job, next))));
        self
    }

    /// A handle that starts the graceful stop.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shutdown.clone())
    }

    /// The worker id it subscribes with.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Like [`Worker::run`], and SIGTERM or SIGINT start the graceful stop (a second one does
    /// not skip its steps: SIGKILL does).
    #[cfg(unix)]
    pub async fn run_until_signal(self) -> Result<(), RunError> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).map_err(RunError::Signals)?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(RunError::Signals)?;
        let stop = self.shutdown_handle();
        let _signals = AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = interrupt.recv() => {}
                }
                stop.shutdown();
            }
        }));
        self.run().await
    }

    /// Works jobs until a graceful stop ([`ShutdownHandle::shutdown`]) is done, then returns
    /// `Ok`. Reconnects by itself when the stream breaks; returns an error at once when no
    /// handler is registered, or when the broker refuses the stream with a code that retrying
    /// would not change ([`RunError::Refused`]).
    ///
    /// The graceful stop, in order: no new jobs (`flow` 0); the jobs not yet started are
    /// released; running handlers get the grace to finish; then their tokens fire and their
    /// jobs are released whatever they end with; a handler that has not returned 1 s later has
    /// its job released anyway (its own answer is dropped, its task aborted at its next
    /// `.await`); the answers sent are awaited (at most 1 s more); every stream is half-closed
    /// (and cancelled after 2 s). A stream that ends before that is reopened as usual (after
    /// the backoff, regrouped) so that the answers still to come reach the broker; it gets
    /// `flow` 0 at once, and what it is pushed meanwhile is released. Nothing is reopened once
    /// the streams are being closed, and the stop keeps its bounds when no stream can be.
    pub async fn run(self) -> Result<(), RunError> {
        if self.handlers.is_empty() {
            return Err(RunError::NoHandlers);
        }
        let mut queues: Vec<String> = self.handlers.keys().cloned().collect();
        queues.sort();
        let subscribe = v1::SubscribeRequest {
            queues,
            worker_id: self.worker_id.clone(),
            max_in_flight: i32::try_from(self.concurrency + self.prefetch).unwrap_or(i32::MAX),
            lease_duration: self.lease.map(duration),
            batch_pushes: true,
        };
        let (streams, open) = Streams::new();
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let (acks_tx, acks) = mpsc::unbounded_channel();
        let (freed_tx, freed) = mpsc::unbounded_channel();
        let closing = CancellationToken::new();
        let mut connection = AbortOnDrop(tokio::spawn(keep_connected(Connection {
            client: self.client.clone(),
            subscribe,
            streams: streams.clone(),
            events: events_tx,
            closing: closing.clone(),
        })));
        let _coalescer = AbortOnDrop(tokio::spawn(coalesce_acks(acks, open.clone())));
        let chain: Arc<[WorkerMiddleware]> = Arc::from(self.middleware);
        let handlers = self
            .handlers
            .into_iter()
            .map(|(queue, handler)| (queue, middleware::wrap(&chain, handler)))
            .collect();
        let mut run = RunLoop {
            jobs: Arc::new(JobContext {
                handlers,
                open,
                acks: acks_tx,
                freed: freed_tx,
                abandon: CancellationToken::new(),
            }),
            concurrency: self.concurrency,
            grace: self.grace,
            held: HashMap::new(),
            tasks: JoinSet::new(),
            waiting: VecDeque::new(),
            running: 0,
            stopping: None,
            streams,
            undrained: HashSet::new(),
        };
        let ended = run.work(&mut events, freed, &self.shutdown).await;
        // Step 6 (or a refusal): the connection task half-closes every stream and cancels those
        // that have not ended within CLOSE_TIMEOUT.
        closing.cancel();
        let result = match ended {
            Ended::Stopped => {
                let _ = tokio::time::timeout(CLOSE_TIMEOUT * 2, &mut connection).await;
                Ok(())
            }
            Ended::Refused(status) => Err(RunError::Refused(status)),
        };
        drop(connection);
        drop(events);
        // Handlers still running past the grace are abandoned: their leases run out.
        run.tasks.shutdown().await;
        result
    }
}

/// What the connection task and its stream tasks tell the run loop.
// Jobs are by far the most common event; boxing them would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Event {
    /// A job, and the stream that pushed it (its answers go there first).
    Job(v1::LeasedJob, WorkStream),
    LeaseLost(String),
    CancelRequested(String),
    /// A stream that opened during the graceful stop got its `flow` 0 (by serial): the stop
    /// waits for it to drain too.
    Undrained(u64),
    /// The stream (by serial) pushes nothing more: its `flow` 0 was answered and every job it
    /// pushed before that was forwarded, or it ended.
    Drained(u64),
    /// The broker refused a stream with a code retrying would not change.
    Refused(Status),
}

/// What the connection task needs.
struct Connection {
    client: Client,
    /// The worker's subscription: every handled queue and the whole `max_in_flight`; each
    /// stream subscribes to its group's queues with its group's share.
    subscribe: v1::SubscribeRequest,
    streams: Arc<Streams>,
    events: mpsc::UnboundedSender<Event>,
    /// Fired at the end of [`Worker::run`]: every stream is closed.
    closing: CancellationToken,
}

/// What a stream task tells the connection task.
enum StreamNews {
    /// Its subscription was accepted: the backoff starts over.
    Subscribed,
    /// The stream of task `task` ended, or failed to open: on its own with `end` (`None`: the
    /// broker closed it), or because the connection task `asked` it to.
    Ended {
        task: u64,
        end: Option<Status>,
        asked: bool,
    },
}

/// Holds one `Work` stream per group of the handled queues (`docs/worker-contract.md` §5,
/// "One stream per leading node"). When a stream ends it waits the backoff, fetches the table
/// again and groups anew: streams whose group is still in the set keep running, the others are
/// ended, the missing ones opened. While a group goes to any node (in a cluster), it also
/// fetches the table again and regroups after each backoff delay. During a graceful stop too
/// (§6): a stream that ends before step 6 is reopened, so that the answers still to come reach
/// the broker (a stream published during the stop gets `flow` 0 at once, see [`Streams::add`]).
/// Returns once `closing` fires (step 6: after closing every stream; nothing is opened after
/// it) or a stream is refused for good.
async fn keep_connected(connection: Connection) {
    let Connection {
        client,
        subscribe,
        streams,
        events,
        closing,
    } = connection;
    let (news_tx, mut news) = mpsc::unbounded_channel();
    // Dropped (the run call gave up on the worker), it aborts every stream task; each cancels
    // its stream.
    let mut tasks = JoinSet::new();
    // The streams held (opening or open) by group: their task's number and what ends them.
    let mut held: HashMap<StreamGroup, (u64, CancellationToken)> = HashMap::new();
    let mut next_task = 0u64;
    let mut backoff = BACKOFF_MIN;
    let mut regroup = true;
    // When the table is fetched again while a group goes to any node (§5): after a backoff
    // delay counted from the latest grouping.
    let mut refresh_at: Option<Instant> = None;
    loop {
        if regroup {
            regroup = false;
            let groups = tokio::select! {
                groups = client.stream_groups(&subscribe.queues, subscribe.max_in_flight) => groups,
                _ = closing.cancelled() => break,
            };
            held.retain(|group, (_, end)| {
                let keep = groups.contains(group);
                if !keep {
                    end.cancel();
                }
                keep
            });
            for group in groups {
                if held.contains_key(&group) {
                    continue;
                }
                next_task += 1;
                let end = CancellationToken::new();
                tasks.spawn(run_stream(StreamTask {
                    client: client.clone(),
                    address: group.address.clone(),
                    subscribe: v1::SubscribeRequest {
                        queues: group.queues.clone(),
                        max_in_flight: group.max_in_flight,
                        ..subscribe.clone()
                    },
                    task: next_task,
                    streams: streams.clone(),
                    events: events.clone(),
                    news: news_tx.clone(),
                    end: end.clone(),
                }));
                held.insert(group, (next_task, end));
            }
            refresh_at = refreshes_table(held.keys(), client.routes_cluster())
                .then(|| Instant::now() + full_jitter(backoff));
        }
        let ended = tokio::select! {
            Some(first) = news.recv() => {
                let mut ended = take_news(first, &mut held, &mut backoff);
                while let Ok(next) = news.try_recv() {
                    ended = merge_ends(ended, take_news(next, &mut held, &mut backoff));
                }
                ended
            }
            Some(_) = tasks.join_next() => continue,
            () = sleep_until_some(refresh_at), if refresh_at.is_some() => {
                // A node relays the any-node group's stream once it knows the new leader, and
                // no leader change ends that relay: the next table shows the leader, and the
                // regrouping moves those queues to its own stream. The backoff grows as after a
                // failed try (and starts over when a stream subscribes).
                backoff = (backoff * 2).min(BACKOFF_MAX);
                client.routes_changed();
                regroup = true;
                continue;
            }
            _ = closing.cancelled() => break,
        };
        let Some(end) = ended else { continue };
        if let Some(status) = &end
            && !reconnectable(status.code())
        {
            let _ = events.send(Event::Refused(status.clone()));
            return;
        }
        // Reopened during a graceful stop too (until step 6 fires `closing`): the answers still
        // to come need a stream.
        let pause = full_jitter(backoff);
        eprintln!(
            "jobbroker worker: work stream ended ({}); regrouping in {pause:?}",
            end.map_or_else(|| "closed by the broker".to_string(), |s| s.to_string())
        );
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = closing.cancelled() => break,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
        // Streams that ended during the pause are in this regrouping too.
        while let Ok(next) = news.try_recv() {
            if let Some(Some(status)) = take_news(next, &mut held, &mut backoff)
                && !reconnectable(status.code())
            {
                let _ = events.send(Event::Refused(status));
                return;
            }
        }
        regroup = true;
    }
    // Closing: every stream is half-closed, and cancelled if it has not ended in CLOSE_TIMEOUT.
    for (_, end) in held.values() {
        end.cancel();
    }
    while tasks.join_next().await.is_some() {}
}

/// Whether the worker fetches the table again after a backoff delay although no stream ended
/// (`docs/worker-contract.md` §5): while it holds a group sent to any node, in a cluster (a
/// partition had no leader in the table; outside a cluster the one group is for any node and
/// there is nothing to learn).
fn refreshes_table<'a>(
    groups: impl IntoIterator<Item = &'a StreamGroup>,
    is_cluster: bool,
) -> bool {
    is_cluster && groups.into_iter().any(|group| group.address.is_none())
}

/// Sleeps until `at`; never returns for `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Applies one piece of news to `held`; `Some(end)` when a stream ended on its own.
fn take_news(
    news: StreamNews,
    held: &mut HashMap<StreamGroup, (u64, CancellationToken)>,
    backoff: &mut Duration,
) -> Option<Option<Status>> {
    match news {
        StreamNews::Subscribed => {
            *backoff = BACKOFF_MIN;
            None
        }
        StreamNews::Ended { asked: true, .. } => None,
        StreamNews::Ended { task, end, .. } => {
            held.retain(|_, (t, _)| *t != task);
            Some(end)
        }
    }
}

/// Of two stream ends, the one that decides: a refusal for good outranks the others.
fn merge_ends(a: Option<Option<Status>>, b: Option<Option<Status>>) -> Option<Option<Status>> {
    let refused = |end: &Option<Option<Status>>| matches!(end, Some(Some(status)) if !reconnectable(status.code()));
    match (a, b) {
        (a, b) if refused(&b) || a.is_none() => b,
        (a, _) => a,
    }
}

/// What one stream task needs.
struct StreamTask {
    client: Client,
    /// Its group's node; `None`: any node.
    address: Option<String>,
    subscribe: v1::SubscribeRequest,
    /// Its number, in its news.
    task: u64,
    streams: Arc<Streams>,
    events: mpsc::UnboundedSender<Event>,
    news: mpsc::UnboundedSender<StreamNews>,
    /// Fired when a regrouping drops its group, or the worker closes: it half-closes the stream.
    end: CancellationToken,
}

/// Opens one group's stream and forwards what it delivers until it ends, or until it is told
/// to end; then tells the connection task.
async fn run_stream(task: StreamTask) {
    let StreamTask {
        client,
        address,
        subscribe,
        task,
        streams,
        events,
        news,
        end,
    } = task;
    let ended = |status: Option<Status>, asked: bool| {
        let _ = news.send(StreamNews::Ended {
            task,
            end: status,
            asked,
        });
    };
    // During a graceful stop too: the stream gets `flow` 0 as it is published, and what it is
    // pushed before that is released.
    let opened = tokio::select! {
        opened = client.work_at(address.as_deref(), subscribe) => opened,
        _ = end.cancelled() => return ended(None, true),
    };
    let (stream, mut delivered) = match opened {
        Ok(opened) => opened,
        Err(status) => return ended(Some(status), false),
    };
    // An aborted task (the run call gave up) takes its stream with it.
    let _cancel = CancelOnDrop::new(&stream);
    let _ = news.send(StreamNews::Subscribed);
    let flow_answered = Arc::new(tokio::sync::Notify::new());
    streams.add(&stream, &flow_answered, &events);
    let end_status = loop {
        tokio::select! {
            delivered_event = delivered.recv() => match forward(delivered_event, &events, &stream) {
                Forwarded::Sent => {}
                Forwarded::Ended(end) => break end,
                Forwarded::RunGone => return streams.remove(&stream),
            },
            () = flow_answered.notified() => {
                // The reader queues a push before it hands out the result of a later request,
                // so every job pushed before the flow took effect is in `delivered` now: forward
                // them before saying so.
                let mut ended = None;
                while let Ok(delivered_event) = delivered.try_recv() {
                    match forward(Some(delivered_event), &events, &stream) {
                        Forwarded::Sent => {}
                        Forwarded::Ended(end) => {
                            ended = Some(end);
                            break;
                        }
                        Forwarded::RunGone => return streams.remove(&stream),
                    }
                }
                let _ = events.send(Event::Drained(stream.serial()));
                if let Some(end) = ended {
                    break end;
                }
            }
            _ = end.cancelled() => {
                // No answer goes to it any more; those under way still get their results.
                streams.remove(&stream);
                close_stream(&stream, &mut delivered, &events).await;
                let _ = events.send(Event::Drained(stream.serial()));
                return ended(None, true);
            }
        }
    };
    streams.remove(&stream);
    let _ = events.send(Event::Drained(stream.serial()));
    // Its node may be gone or no longer lead the queues: the regrouping asks for the cluster's
    // layout again.
    client.work_stream_ended(&stream, end_status.as_ref());
    ended(end_status, false);
}

/// Half-closes `stream` and waits for its end, forwarding what it still pushes; cancels it if
/// it has not ended within [`CLOSE_TIMEOUT`].
async fn close_stream(
    stream: &WorkStream,
    delivered: &mut mpsc::UnboundedReceiver<WorkEvent>,
    events: &mpsc::UnboundedSender<Event>,
) {
    stream.close();
    let ended = tokio::time::timeout(CLOSE_TIMEOUT, async {
        loop {
            match forward(delivered.recv().await, events, stream) {
                Forwarded::Ended(_) => return,
                // After the run loop returned, jobs pushed meanwhile are left to their leases.
                Forwarded::Sent | Forwarded::RunGone => {}
            }
        }
    })
    .await;
    if ended.is_err() {
        stream.cancel();
    }
}

enum Forwarded {
    Sent,
    Ended(Option<Status>),
    /// The run loop is gone: nobody listens any more.
    RunGone,
}

/// Passes one event of `stream` on to the run loop.
fn forward(
    event: Option<WorkEvent>,
    events: &mpsc::UnboundedSender<Event>,
    stream: &WorkStream,
) -> Forwarded {
    let event = match event {
        Some(WorkEvent::Job(job)) => Event::Job(job, stream.clone()),
        Some(WorkEvent::LeaseLost(id)) => Event::LeaseLost(id),
        Some(WorkEvent::CancelRequested(id)) => Event::CancelRequested(id),
        Some(WorkEvent::Closed(end)) => return Forwarded::Ended(end),
        None => return Forwarded::Ended(None),
    };
    match events.send(event) {
        Ok(()) => Forwarded::Sent,
        Err(_) => Forwarded::RunGone,
    }
}

/// The worker's open streams and the graceful stop's "stop taking": what the run loop, the
/// connection task and the stream tasks share.
struct Streams {
    state: Mutex<StreamsState>,
    /// What every sender reads: the streams open now, oldest first.
    published: watch::Sender<Vec<WorkStream>>,
}

#[derive(Default)]
struct StreamsState {
    /// Set when the stop begins: a stream published after that (one reopened during the stop)
    /// gets `flow` 0 at once. The lock is held while a stream is published, so none escapes
    /// the flow 0.
    draining: bool,
    /// The open streams, each with how it hears that its `flow` 0 was answered.
    open: Vec<(WorkStream, Arc<tokio::sync::Notify>)>,
}

impl Streams {
    fn new() -> (Arc<Self>, OpenStreams) {
        let (published, open) = watch::channel(Vec::new());
        let streams = Self {
            state: Mutex::new(StreamsState::default()),
            published,
        };
        (Arc::new(streams), open)
    }

    /// Publishes a stream that opened; during the stop, after queueing its `flow` 0 (first,
    /// before anything the run loop sends on it).
    fn add(
        &self,
        stream: &WorkStream,
        flow_answered: &Arc<tokio::sync::Notify>,
        events: &mpsc::UnboundedSender<Event>,
    ) {
        let mut state = self.state.lock().unwrap();
        if state.draining && send_flow_zero(stream, flow_answered) {
            let _ = events.send(Event::Undrained(stream.serial()));
        }
        state.open.push((stream.clone(), flow_answered.clone()));
        self.publish(&state);
    }

    /// Takes a stream out of what senders use (it ended, or is being ended).
    fn remove(&self, stream: &WorkStream) {
        let mut state = self.state.lock().unwrap();
        state.open.retain(|(s, _)| s.serial() != stream.serial());
        self.publish(&state);
    }

    /// Step 1 of the graceful stop: `flow` 0 on every open stream. Returns the serials of the
    /// streams it went out on.
    fn stop_taking(&self) -> HashSet<u64> {
        let mut state = self.state.lock().unwrap();
        state.draining = true;
        state
            .open
            .iter()
            .filter(|(stream, flow_answered)| send_flow_zero(stream, flow_answered))
            .map(|(stream, _)| stream.serial())
            .collect()
    }

    fn publish(&self, state: &StreamsState) {
        self.published
            .send_replace(state.open.iter().map(|(s, _)| s.clone()).collect());
    }
}

/// Queues `flow { max_in_flight: 0 }` on `stream` at once (so it precedes any release sent
/// after it); `flow_answered` hears its answer (or the stream's end). False when the stream
/// takes no more requests.
fn send_flow_zero(stream: &WorkStream, flow_answered: &Arc<tokio::sync::Notify>) -> bool {
    let Ok(waiter) = stream.start(Request::Flow(v1::FlowRequest { max_in_flight: 0 })) else {
        return false;
    };
    let (stream, flow_answered) = (stream.clone(), flow_answered.clone());
    tokio::spawn(async move {
        if let Err(status) = stream.finish(waiter).await {
            eprintln!("jobbroker worker: flow 0: {status}");
        }
        flow_answered.notify_one();
    });
    true
}

/// An ack waiting to go out, where it goes, and who waits for its answer.
struct PendingAck {
    ack: v1::AckRequest,
    route: AnswerRoute,
    answered: oneshot::Sender<Result<(), Status>>,
}

/// Keeps one ack message in flight per stream: acks that end while their stream's message waits
/// for its answer go out together as one `ack_batch` when it comes, so a busy worker sends one
/// ack message per round trip and stream, and a quiet one each ack at once. Each ack goes to
/// its job's stream (see [`AnswerRoute`]). An ack the broker answers `UNAVAILABLE` (the whole
/// message, or its item of a batch) is not final: it goes out again after
/// [`ANSWER_RETRY_DELAY`], with the acks queued meanwhile.
async fn coalesce_acks(mut queued: mpsc::UnboundedReceiver<PendingAck>, mut open: OpenStreams) {
    // In arrival order: those whose stream has a message in flight, or that have no stream.
    let mut waiting: Vec<PendingAck> = Vec::new();
    // Streams (by serial) with an ack message in flight.
    let mut busy: HashSet<u64> = HashSet::new();
    // Each returns its stream's serial and the acks refused for now.
    let mut sending: JoinSet<(u64, Vec<PendingAck>)> = JoinSet::new();
    let mut queue_open = true;
    loop {
        let mut batches: HashMap<u64, (WorkStream, Vec<PendingAck>)> = HashMap::new();
        let mut left = Vec::new();
        for pending in waiting.drain(..) {
            match pending.route.now() {
                Some(stream) if !busy.contains(&stream.serial()) => {
                    let (_, batch) = batches
                        .entry(stream.serial())
                        .or_insert_with(|| (stream, Vec::new()));
                    if batch.len() < MAX_ACK_BATCH {
                        batch.push(pending);
                    } else {
                        left.push(pending);
                    }
                }
                _ => left.push(pending),
            }
        }
        waiting = left;
        for (serial, (stream, batch)) in batches {
            busy.insert(serial);
            sending.spawn(send_acks(stream, batch, open.clone()));
        }
        if !queue_open && waiting.is_empty() && sending.is_empty() {
            return;
        }
        tokio::select! {
            next = queued.recv(), if queue_open => match next {
                Some(pending) => {
                    waiting.push(pending);
                    while let Ok(pending) = queued.try_recv() {
                        waiting.push(pending);
                    }
                }
                None => queue_open = false,
            },
            Some(done) = sending.join_next() => {
                if let Ok((serial, refused)) = done {
                    busy.remove(&serial);
                    // Older than those queued meanwhile: they go first.
                    waiting.splice(0..0, refused);
                }
            }
            changed = open.changed(), if !waiting.is_empty() => {
                if changed.is_err() {
                    // The worker stopped: nothing will carry them.
                    for pending in waiting.drain(..) {
                        let _ = pending.answered.send(Err(Status::unavailable(
                            "the worker stopped before the broker answered",
                        )));
                    }
                    return;
                }
            }
        }
    }
}

/// Sends one ack message (one ack, or a batch) on `stream`, until answered; returns the
/// stream's serial and the acks the broker refused for now, after [`ANSWER_RETRY_DELAY`].
async fn send_acks(
    stream: WorkStream,
    batch: Vec<PendingAck>,
    open: OpenStreams,
) -> (u64, Vec<PendingAck>) {
    let serial = stream.serial();
    let request = if batch.len() == 1 {
        Request::Ack(batch[0].ack.clone())
    } else {
        Request::AckBatch(v1::AckBatchRequest {
            acks: batch.iter().map(|p| p.ack.clone()).collect(),
        })
    };
    let mut route = AnswerRoute {
        home: Some(stream),
        open,
    };
    let mut refused = Vec::new();
    match send_until_answered(route.clone(), request).await {
        Ok(result) => {
            let mut item_errors: HashMap<usize, Status> = result
                .item_errors
                .into_iter()
                .map(|e| {
                    let status = Status::new(Code::from_i32(e.code), e.message);
                    (usize::try_from(e.index).unwrap_or(usize::MAX), status)
                })
                .collect();
            for (index, pending) in batch.into_iter().enumerate() {
                match item_errors.remove(&index) {
                    Some(status) if status.code() == Code::Unavailable => {
                        eprintln!(
                            "jobbroker worker: job {}: ack refused for now ({}); sending it again",
                            pending.ack.job_id,
                            status.message()
                        );
                        refused.push(pending);
                    }
                    answer => {
                        let _ = pending.answered.send(answer.map_or(Ok(()), Err));
                    }
                }
            }
            if !refused.is_empty() {
                route.open.mark_unchanged();
                route.wait_to_resend().await;
            }
        }
        Err(status) => {
            for pending in batch {
                let _ = pending.answered.send(Err(status.clone()));
            }
        }
    }
    (serial, refused)
}

/// What every job task needs.
struct JobContext {
    handlers: HashMap<String, Handler>,
    open: OpenStreams,
    acks: mpsc::UnboundedSender<PendingAck>,
    /// One message per handler that returned: its concurrency slot is free.
    freed: mpsc::UnboundedSender<()>,
    /// Fired when a graceful stop stops waiting for handlers: those still running have their
    /// jobs released and their own answers dropped.
    abandon: CancellationToken,
}

/// What a job task tells the broker.
enum Answer {
    Ack(Vec<u8>),
    Fail {
        error: String,
        permanent: bool,
        retry_after: Option<Duration>,
    },
    Release(Option<Duration>),
}

/// The answer for a job: `outcome` is the handler's (`None`: it never started). `None` when
/// nothing may be sent (the broker already ended the attempt).
fn answer_for(
    reason: Option<CancelReason>,
    outcome: Option<Result<Output, WorkerError>>,
) -> Option<Answer> {
    let cancelled = || Answer::Fail {
        error: "cancelled".into(),
        permanent: false,
        retry_after: None,
    };
    match (reason, outcome) {
        (Some(CancelReason::LeaseLost | CancelReason::TimedOut), _) => None,
        (Some(CancelReason::Shutdown), _) => Some(Answer::Release(None)),
        (Some(CancelReason::Operator), None) => Some(cancelled()),
        // Not started and not cancelled: the graceful stop gives it back.
        (None, None) => Some(Answer::Release(None)),
        // Done despite the cancel: the work happened, so say so.
        (_, Some(Ok(output))) => Some(Answer::Ack(output.0)),
        (Some(CancelReason::Operator), Some(Err(_))) => Some(cancelled()),
        (_, Some(Err(error))) => Some(match error {
            WorkerError::Permanent(message) => Answer::Fail {
                error: message,
                permanent: true,
                retry_after: None,
            },
            WorkerError::RetryAfter { delay, message } => Answer::Fail {
                error: message,
                permanent: false,
                retry_after: Some(delay),
            },
            WorkerError::Snooze(delay) => Answer::Release(Some(delay)),
            other => Answer::Fail {
                error: other.to_string(),
                permanent: false,
                retry_after: None,
            },
        }),
    }
}

/// Heartbeats `held` every third of its lease until the lease is gone (the task is aborted
/// when the job's answer is in).
async fn keep_lease(route: AnswerRoute, held: Arc<Held>, mut interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        if held.lease_gone() {
            return;
        }
        // Disconnected: the next stream carries the next beat (beats are not replayed).
        let Some(stream) = route.now() else {
            continue;
        };
        let answer = stream.request(held.heartbeat(None, None)).await;
        held.heard(&answer);
        if let Ok(result) = &answer {
            interval = third_of_lease(result.lease_deadline.as_ref());
        }
    }
}

/// Works one held job from its arrival to its answer.
async fn work_job(
    jobs: Arc<JobContext>,
    leased: v1::LeasedJob,
    home: WorkStream,
    held: Arc<Held>,
    mut start: oneshot::Receiver<()>,
) {
    let route = AnswerRoute {
        home: Some(home),
        open: jobs.open.clone(),
    };
    let _heartbeats = AbortOnDrop(tokio::spawn(keep_lease(
        route.clone(),
        held.clone(),
        third_of_lease(leased.lease_deadline.as_ref()),
    )));
    // The broker ends the attempt TIMED_OUT at timeout_at; the handler hears it then too, without
    // waiting for the broker's lease_lost.
    let _timeout = leased.timeout_at.as_ref().map(|t| {
        let (at, held) = (instant_at(t), held.clone());
        AbortOnDrop(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            held.fire(CancelReason::TimedOut);
        }))
    });

    let started = tokio::select! {
        biased;
        go = &mut start => go.is_ok(),
        _ = held.token.cancelled() => {
            // A start sent just now would hold a slot no handler uses: give it back.
            start.close();
            if start.try_recv().is_ok() {
                let _ = jobs.freed.send(());
            }
            false
        }
    };
    let outcome = if started {
        let handler = jobs.handlers.get(&leased.queue).cloned();
        let job = Job::new(leased.clone(), held.clone(), route.clone());
        let outcome = match handler {
            Some(handler) => tokio::select! {
                outcome = run_handler(handler, job) => outcome,
                // The stop gives up on the handler (its token fired a second ago): the job is
                // released below (the reason is Shutdown), and no slot matters any more.
                _ = jobs.abandon.cancelled() => return_abandoned(&held),
            },
            None => Err(WorkerError::other(format!(
                "no handler for queue {:?}",
                leased.queue
            ))),
        };
        let _ = jobs.freed.send(());
        Some(outcome)
    } else {
        None
    };

    let Some(answer) = answer_for(held.reason(), outcome) else {
        return;
    };
    let (job_id, lease_id) = (leased.job_id.clone(), leased.lease_id.clone());
    let answered = match answer {
        Answer::Ack(result) => {
            let (answered, answer) = oneshot::channel();
            let ack = v1::AckRequest {
                job_id,
                lease_id,
                result,
            };
            let _ = jobs.acks.send(PendingAck {
                ack,
                route: route.clone(),
                answered,
            });
            answer
                .await
                .unwrap_or_else(|_| Err(Status::unavailable("the worker stopped")))
        }
        Answer::Fail {
            error,
            permanent,
            retry_after,
        } => {
            let fail = Request::Fail(v1::FailRequest {
                job_id,
                lease_id,
                error,
                permanent,
                retry_after: retry_after.map(duration),
            });
            send_until_answered(route.clone(), fail).await.map(|_| ())
        }
        Answer::Release(delay) => {
            let release = Request::Release(v1::ReleaseRequest {
                job_id,
                lease_id,
                delay: delay.map(duration),
            });
            send_until_answered(route, release).await.map(|_| ())
        }
    };
    match answered {
        Ok(()) => {}
        Err(status) if is_stale(&status) => eprintln!(
            "jobbroker worker: job {}: the broker no longer holds this lease; answer ignored ({})",
            leased.job_id,
            status.message()
        ),
        Err(status) => eprintln!(
            "jobbroker worker: job {}: answer failed: {status}",
            leased.job_id
        ),
    }
}

/// The outcome of a handler a graceful stop gave up on.
fn return_abandoned(held: &Held) -> Result<Output, WorkerError> {
    held.fire(CancelReason::Shutdown);
    Err(WorkerError::Cancelled)
}

/// Runs the handler in a task of its own, so that a panic is this attempt's failure only.
async fn run_handler(handler: Handler, job: Job) -> Result<Output, WorkerError> {
    let mut task = AbortOnDrop(tokio::spawn(handler(job)));
    match (&mut task).await {
        Ok(outcome) => outcome,
        Err(error) if error.is_panic() => {
            let panic = error.into_panic();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic".into());
            Err(WorkerError::other(format!("handler panicked: {message}")))
        }
        Err(error) => Err(WorkerError::other(format!("handler task ended: {error}"))),
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// The graceful stop under way.
struct Stopping {
    /// When running handlers' tokens fire.
    grace_end: Instant,
    grace_over: bool,
    /// When handlers still running are abandoned (their jobs released).
    returns_end: Instant,
    returns_over: bool,
    /// When the helper stops waiting for answers.
    answers_end: Instant,
}

/// How [`RunLoop::work`] ended.
enum Ended {
    /// The graceful stop is done (or gave up waiting); the streams still have to be closed.
    Stopped,
    Refused(Status),
}

/// The run loop's state: the held jobs and the slots.
struct RunLoop {
    jobs: Arc<JobContext>,
    concurrency: usize,
    grace: Duration,
    /// The held leases by job id (at most one attempt of a job is held at a time).
    held: HashMap<String, Arc<Held>>,
    /// One task per held job; each returns its (job id, lease id).
    tasks: JoinSet<(String, String)>,
    /// Jobs waiting for a slot, in arrival order: the sender starts one.
    waiting: VecDeque<oneshot::Sender<()>>,
    /// Handlers running now.
    running: usize,
    stopping: Option<Stopping>,
    /// Shared with the connection task: the open streams, told when the stop begins.
    streams: Arc<Streams>,
    /// During the stop, the streams (by serial) whose `flow` 0 is not answered yet: jobs they
    /// pushed before it may still arrive (and are released).
    undrained: HashSet<u64>,
}

impl RunLoop {
    async fn work(
        &mut self,
        events: &mut mpsc::UnboundedReceiver<Event>,
        mut freed: mpsc::UnboundedReceiver<()>,
        shutdown: &CancellationToken,
    ) -> Ended {
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        loop {
            if self.stopping.is_some() && self.undrained.is_empty() && self.tasks.is_empty() {
                return Ended::Stopped;
            }
            let grace_end = self.stopping.as_ref().map_or(far, |s| s.grace_end);
            let grace_running = self.stopping.as_ref().is_some_and(|s| !s.grace_over);
            let returns_end = self.stopping.as_ref().map_or(far, |s| s.returns_end);
            let returns_running = self.stopping.as_ref().is_some_and(|s| !s.returns_over);
            let answers_end = self.stopping.as_ref().map_or(far, |s| s.answers_end);
            tokio::select! {
                event = events.recv() => match event {
                    Some(Event::Job(job, home)) => self.accept(job, home),
                    Some(Event::LeaseLost(id)) => {
                        if let Some(held) = self.held.get(&id) {
                            held.lease_lost();
                        }
                    }
                    Some(Event::CancelRequested(id)) => self.fire(&id, CancelReason::Operator),
                    Some(Event::Refused(status)) => return Ended::Refused(status),
                    Some(Event::Undrained(serial)) => {
                        self.undrained.insert(serial);
                    }
                    Some(Event::Drained(serial)) => {
                        self.undrained.remove(&serial);
                    }
                    None => return Ended::Stopped,
                },
                Some(()) = freed.recv() => {
                    self.running -= 1;
                    self.start_waiting();
                }
                Some(ended) = self.tasks.join_next() => {
                    if let Ok((job_id, lease_id)) = ended
                        && self.held.get(&job_id).is_some_and(|h| h.lease_id == lease_id)
                    {
                        self.held.remove(&job_id);
                    }
                }
                _ = shutdown.cancelled(), if self.stopping.is_none() => self.begin_stop(),
                _ = tokio::time::sleep_until(grace_end), if grace_running => {
                    if let Some(stopping) = self.stopping.as_mut() {
                        stopping.grace_over = true;
                    }
                    for held in self.held.values() {
                        held.fire(CancelReason::Shutdown);
                    }
                }
                _ = tokio::time::sleep_until(returns_end), if returns_running => {
                    if let Some(stopping) = self.stopping.as_mut() {
                        stopping.returns_over = true;
                    }
                    self.jobs.abandon.cancel();
                }
                _ = tokio::time::sleep_until(answers_end), if self.stopping.is_some() => {
                    eprintln!("jobbroker worker: stopping without the answers still missing");
                    return Ended::Stopped;
                }
            }
        }
    }

    /// Holds a pushed job: it waits for a slot, or is released at once during a stop.
    fn accept(&mut self, job: v1::LeasedJob, home: WorkStream) {
        let held = Arc::new(Held::new(&job));
        // A new attempt of a job still held means the old lease is gone.
        if let Some(old) = self.held.insert(job.job_id.clone(), held.clone()) {
            old.fire(CancelReason::LeaseLost);
        }
        let (start, started) = oneshot::channel();
        if self.stopping.is_none() {
            self.waiting.push_back(start);
        }
        let ids = (job.job_id.clone(), job.lease_id.clone());
        let jobs = self.jobs.clone();
        self.tasks.spawn(async move {
            work_job(jobs, job, home, held, started).await;
            ids
        });
        self.start_waiting();
    }

    fn fire(&self, job_id: &str, why: CancelReason) {
        if let Some(held) = self.held.get(job_id) {
            held.fire(why);
        }
    }

    /// Starts waiting jobs, oldest first, while slots are free.
    fn start_waiting(&mut self) {
        while self.running < self.concurrency {
            let Some(start) = self.waiting.pop_front() else {
                return;
            };
            if start.send(()).is_ok() {
                self.running += 1;
            }
        }
    }

    /// Steps 1 and 2 of the graceful stop: flow 0 on every stream, then the jobs not started
    /// are released (their tasks see their start dropped).
    fn begin_stop(&mut self) {
        self.undrained = self.streams.stop_taking();
        self.waiting.clear();
        let grace_end = Instant::now() + self.grace;
        self.stopping = Some(Stopping {
            grace_end,
            grace_over: false,
            returns_end: grace_end + RETURN_AFTER_GRACE,
            returns_over: false,
            answers_end: grace_end + RETURN_AFTER_GRACE + ANSWERS_AFTER_RETURNS,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leased(id: &str) -> v1::LeasedJob {
        v1::LeasedJob {
            job_id: id.into(),
            lease_id: format!("{id}-lease"),
            ..Default::default()
        }
    }

    fn describe(answer: Option<Answer>) -> String {
        match answer {
            None => "nothing".into(),
            Some(Answer::Ack(result)) => format!("ack {}", String::from_utf8_lossy(&result)),
            Some(Answer::Fail {
                error,
                permanent,
                retry_after,
            }) => format!("fail {error:?} permanent={permanent} retry_after={retry_after:?}"),
            Some(Answer::Release(delay)) => format!("release {delay:?}"),
        }
    }

    #[test]
    fn the_handlers_end_decides_the_answer() {
        let ok = || Some(Ok(Output::from("r")));
        let err = |e: WorkerError| Some(Err(e));
        assert_eq!(describe(answer_for(None, ok())), "ack r");
        assert_eq!(
            describe(answer_for(None, err(WorkerError::permanent("bad")))),
            "fail \"bad\" permanent=true retry_after=None"
        );
        assert_eq!(
            describe(answer_for(
                None,
                err(WorkerError::retry_after(Duration::from_secs(2), "429"))
            )),
            "fail \"429\" permanent=false retry_after=Some(2s)"
        );
        assert_eq!(
            describe(answer_for(
                None,
                err(WorkerError::snooze(Duration::from_secs(3)))
            )),
            "release Some(3s)"
        );
        assert_eq!(
            describe(answer_for(None, err(WorkerError::other("boom")))),
            "fail \"boom\" permanent=false retry_after=None"
        );
    }

    #[test]
    fn the_cancellations_cause_overrides_the_handlers_end() {
        let err = || Some(Err(WorkerError::permanent("gave up")));
        // The broker already ended the attempt: anything sent would be refused as stale.
        for reason in [CancelReason::LeaseLost, CancelReason::TimedOut] {
            assert_eq!(describe(answer_for(Some(reason), err())), "nothing");
            assert_eq!(describe(answer_for(Some(reason), None)), "nothing");
        }
        // The stop was not the job's fault: no attempt spent.
        assert_eq!(
            describe(answer_for(Some(CancelReason::Shutdown), err())),
            "release None"
        );
        assert_eq!(
            describe(answer_for(Some(CancelReason::Operator), err())),
            "fail \"cancelled\" permanent=false retry_after=None"
        );
        assert_eq!(
            describe(answer_for(Some(CancelReason::Operator), None)),
            "fail \"cancelled\" permanent=false retry_after=None"
        );
        // Never started, not cancelled: the graceful stop hands it back.
        assert_eq!(describe(answer_for(None, None)), "release None");
    }

    #[test]
    fn a_lost_lease_outranks_every_other_reason() {
        let held = Held::new(&leased("j"));
        held.fire(CancelReason::Operator);
        held.fire(CancelReason::Shutdown);
        assert_eq!(held.reason(), Some(CancelReason::Operator));
        assert!(held.token.is_cancelled());
        held.fire(CancelReason::LeaseLost);
        assert_eq!(held.reason(), Some(CancelReason::LeaseLost));
        held.fire(CancelReason::TimedOut);
        assert_eq!(held.reason(), Some(CancelReason::LeaseLost));
    }

    #[test]
    fn a_lease_lost_past_the_time_out_is_the_time_out() {
        let mut job = leased("j");
        job.timeout_at = Some(prost_types::Timestamp {
            seconds: 1,
            nanos: 0,
        });
        let held = Held::new(&job);
        held.lease_lost();
        assert_eq!(held.reason(), Some(CancelReason::TimedOut));
        let held = Held::new(&leased("k"));
        held.lease_lost();
        assert_eq!(held.reason(), Some(CancelReason::LeaseLost));
    }

    fn checkpoint(steps: &[(&str, &[u8])]) -> Vec<u8> {
        v1::StepCheckpoint {
            steps: steps
                .iter()
                .map(|(name, result)| v1::CompletedStep {
                    name: name.to_string(),
                    result: result.to_vec(),
                })
                .collect(),
        }
        .encode_to_vec()
    }

    #[test]
    fn a_step_checkpoint_is_read_by_the_rules_of_steps_proto() {
        assert!(
            read_step_checkpoint(b"")
                .unwrap()
                .checkpoint
                .steps
                .is_empty()
        );
        let read =
            read_step_checkpoint(&checkpoint(&[("a", b"{\"x\":1}"), ("b", b"null")])).unwrap();
        assert_eq!(read.checkpoint.steps.len(), 2);

        // Fields this version does not know are skipped (field 15, varint 1).
        let mut with_unknown = checkpoint(&[("a", b"1")]);
        with_unknown.extend_from_slice(&[0x78, 0x01]);
        assert!(read_step_checkpoint(&with_unknown).is_ok());

        let refused = [
            (b"\xff\xff".to_vec(), ""),
            // Not empty, yet no step: only a field this version does not know.
            (vec![0x78, 0x01], "no step"),
            (checkpoint(&[("", b"1")]), "name"),
            (checkpoint(&[("a", b"1"), ("a", b"2")]), "repeated"),
            (checkpoint(&[("a", b"not json")]), "not JSON"),
        ];
        for (data, why) in refused {
            let error = read_step_checkpoint(&data).err().expect("refused");
            assert!(error.contains(why), "{error:?} should say {why:?}");
        }
    }

    #[test]
    fn a_group_for_any_node_in_a_cluster_schedules_a_table_refresh() {
        let group = |address: Option<&str>| StreamGroup {
            address: address.map(str::to_string),
            queues: vec!["q".into()],
            max_in_flight: 1,
        };
        let leaders = [group(Some("a:1")), group(Some("b:1"))];
        let with_any_node = [group(Some("a:1")), group(None)];
        assert!(refreshes_table(&with_any_node, true));
        assert!(refreshes_table(&[group(None)], true));
        // Every group on its leader: only a stream's end makes it look again.
        assert!(!refreshes_table(&leaders, true));
        assert!(!refreshes_table(&[], true));
        // Outside a cluster (or without a table) the one group is for any node: nothing to
        // learn from the table.
        assert!(!refreshes_table(&[group(None)], false));
        assert!(!refreshes_table(&with_any_node, false));
    }

    #[test]
    fn full_jitter_stays_within_the_backoff() {
        for _ in 0..100 {
            assert!(full_jitter(BACKOFF_MAX) <= BACKOFF_MAX);
        }
        assert_eq!(full_jitter(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn outputs_are_bytes_text_or_json() {
        assert_eq!(Output::from(vec![1u8, 2]).0, vec![1u8, 2]);
        assert_eq!(Output::from("hé").0, "hé".as_bytes());
        assert_eq!(Output::from(()).0, b"");
        assert_eq!(
            Output::from(serde_json::json!({"a": [1, null]})).0,
            br#"{"a":[1,null]}"#
        );
        assert_eq!(Output::json(&vec!["x"]).unwrap().0, br#"["x"]"#);
    }
}
