//! Rust client for jobbroker, a durable job broker spoken to over gRPC.
//!
//! The API is the tonic code generated from `proto/jobbroker/v1/*.proto`, re-exported under
//! [`v1`]: [`v1::broker_client::BrokerClient`] (producers and workers) and
//! [`v1::admin_client::AdminClient`] (operators), plus every message and enum. On top of it
//! this crate adds:
//!
//! * [`ClientOptions`]: how to reach the broker (addresses, TLS, mutual TLS, bearer token,
//!   deadline, keepalive pings), one set of options for the client and the worker.
//! * [`Client`]: both services, a method per call, safe retries, [`Client::enqueue_and_wait`],
//!   producer middleware, and concurrent enqueues coalesced into `EnqueueBatch` calls.
//! * [`job`] and the `with_` methods of [`v1::EnqueueRequest`]: every enqueue option.
//! * [`Worker`]: the worker helper of `docs/worker-contract.md` (handlers per queue, leases and
//!   heartbeats, cancellation, ack coalescing, reconnects, graceful stop, durable steps,
//!   middleware).
//! * [`WorkStream`]: the `Work` stream with request ids and result routing done for you; every
//!   request returns the broker's [`v1::WorkResult`] (or a [`Status`] carrying its code).
//!
//! Every call carries the `jobbroker-client: jobbroker-rust/<version>` metadata, so
//! `Admin.ListWorkers` can tell which library a worker runs.
//!
//! Errors are [`tonic::Status`]; compare `status.code()` with [`Code`] (e.g.
//! `Code::InvalidArgument` for a malformed request, `Code::FailedPrecondition` for a stale
//! lease).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

mod client;
mod coalescer;
mod enqueue;
pub mod middleware;
pub mod options;
#[cfg(feature = "tracing-otel")]
pub mod otel;
mod partition;
mod router;
mod routing_table;
pub mod worker;
pub use client::{Client, ClientTag, WaitError};
pub use middleware::{EnqueueNext, HandlerNext};
pub use options::{
    ClientOptions, ConnectError, DEFAULT_ADDRESS, DEFAULT_DEADLINE, DEFAULT_KEEPALIVE_TIME,
    DEFAULT_KEEPALIVE_TIMEOUT,
};
pub use partition::{partition_of_job_id, partition_of_queue};
pub use worker::{
    CancelReason, Job, Output, RunError, ShutdownHandle, Worker, WorkerBuilder, WorkerError,
};

pub use prost_types;
pub use tonic;
pub use tonic::{Code, Status};

/// Generated messages, enums and clients of the `jobbroker.v1` proto package.
pub mod v1 {
    #![allow(missing_docs)]
    tonic::include_proto!("jobbroker.v1");
}

use v1::work_request::Request;
use v1::work_response::Response;

/// The generated Broker client over a tonic channel, every call tagged with [`ClientTag`].
pub type BrokerClient = v1::broker_client::BrokerClient<InterceptedService<Channel, ClientTag>>;
/// The generated Admin client over a tonic channel, every call tagged with [`ClientTag`].
pub type AdminClient = v1::admin_client::AdminClient<InterceptedService<Channel, ClientTag>>;

/// The library this crate says it is on every call: `jobbroker-rust/<crate version>`.
pub const CLIENT_NAME: &str = concat!("jobbroker-rust/", env!("CARGO_PKG_VERSION"));

/// An [`v1::EnqueueRequest`] for `queue` and `payload`, every other field at its default; set
/// more with struct update syntax:
///
/// ```
/// let request = jobbroker::v1::EnqueueRequest {
///     dedup_key: "welcome:user_7".into(),
///     priority: 5,
///     ..jobbroker::job("emails", b"{\"user\":7}")
/// };
/// assert_eq!(request.queue, "emails");
/// ```
pub fn job(queue: &str, payload: impl Into<Vec<u8>>) -> v1::EnqueueRequest {
    v1::EnqueueRequest {
        queue: queue.to_string(),
        payload: payload.into(),
        ..Default::default()
    }
}

/// A protobuf Timestamp for a std time (times before 1970 are 1970).
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
    }
}

/// A protobuf Duration for a std one (saturating at i64::MAX seconds).
pub fn duration(d: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// What a `Work` stream delivers besides the results of requests.
// Jobs are by far the most common event; boxing them would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum WorkEvent {
    /// A job pushed to this worker: answer it with ack, fail or release.
    Job(v1::LeasedJob),
    /// The lease of this job ran out: stop working on it and do not ack.
    LeaseLost(String),
    /// An operator cancelled this job: stop and ack or fail it.
    CancelRequested(String),
    /// The stream ended: `None` when the broker closed it cleanly, else the status it ended
    /// with (`UNAVAILABLE` when its connection broke). Always the last event.
    Closed(Option<Status>),
}

struct Shared {
    tx: Mutex<Option<mpsc::UnboundedSender<v1::WorkRequest>>>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<v1::WorkResult>>>,
    end: Mutex<Option<Status>>,
    /// The task reading responses: aborting it drops the response stream, cancelling the call.
    reader: Mutex<Option<AbortHandle>>,
    /// The address of the node the stream is open to.
    node: String,
    /// Tells the streams of a process apart (a worker holds one per leading node).
    serial: u64,
}

impl Shared {
    fn new(tx: mpsc::UnboundedSender<v1::WorkRequest>, node: String) -> Self {
        static SERIALS: AtomicU64 = AtomicU64::new(1);
        Self {
            tx: Mutex::new(Some(tx)),
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            end: Mutex::new(None),
            reader: Mutex::new(None),
            node,
            serial: SERIALS.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// The sending half of a `Work` stream. Cheap to clone; safe to use from many tasks. Each call
/// sends one request and waits for the broker's result for it: a non-OK result comes back as
/// a [`Status`] with the broker's code; if the stream ends first, the status it ended with
/// (or `UNAVAILABLE`).
#[derive(Clone)]
pub struct WorkStream {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WorkStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkStream").finish_non_exhaustive()
    }
}

impl WorkStream {
    /// Extends the lease of `job` by its own duration; with `checkpoint`, also saves it. The
    /// result carries the new `lease_deadline` and `cancel_requested`. `FAILED_PRECONDITION`
    /// when the lease is gone.
    pub async fn heartbeat(
        &self,
        job: &v1::LeasedJob,
        checkpoint: Option<Vec<u8>>,
    ) -> Result<v1::WorkResult, Status> {
        self.request(Request::Heartbeat(v1::HeartbeatRequest {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            extend_by: None,
            checkpoint,
            progress: None,
        }))
        .await
    }

    /// Completes `job`, keeping `result` with it.
    pub async fn ack(
        &self,
        job: &v1::LeasedJob,
        result: Vec<u8>,
    ) -> Result<v1::WorkResult, Status> {
        self.request(Request::Ack(v1::AckRequest {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            result,
        }))
        .await
    }

    /// Fails this attempt of `job`. It is retried after the queue's backoff (or after
    /// `retry_after`), unless `permanent` or no attempts are left: then it is FAILED.
    pub async fn fail(
        &self,
        job: &v1::LeasedJob,
        error: &str,
        permanent: bool,
        retry_after: Option<std::time::Duration>,
    ) -> Result<v1::WorkResult, Status> {
        self.request(Request::Fail(v1::FailRequest {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            error: error.to_string(),
            permanent,
            retry_after: retry_after.map(duration),
        }))
        .await
    }

    /// Gives `job` back unstarted: READY again, no attempt counted.
    pub async fn release(&self, job: &v1::LeasedJob) -> Result<v1::WorkResult, Status> {
        self.request(Request::Release(v1::ReleaseRequest {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            delay: None,
        }))
        .await
    }

    /// Changes how many unanswered jobs the broker may push; 0 drains (nothing more is pushed).
    pub async fn flow(&self, max_in_flight: i32) -> Result<v1::WorkResult, Status> {
        self.request(Request::Flow(v1::FlowRequest { max_in_flight }))
            .await
    }

    /// Sends any request and waits for its result.
    pub async fn request(&self, request: Request) -> Result<v1::WorkResult, Status> {
        let waiter = self.start(request)?;
        self.finish(waiter).await
    }

    /// Half-closes the stream: no more requests can be sent (they fail with `UNAVAILABLE`).
    /// Results of requests already sent still arrive; the broker then ends the stream, which
    /// shows as [`WorkEvent::Closed`].
    pub fn close(&self) {
        self.shared.tx.lock().unwrap().take();
    }

    /// True once the stream ended (the broker closed it, it broke, or it was cancelled): every
    /// request on it fails from then on, and a new stream must be opened.
    pub fn is_closed(&self) -> bool {
        self.shared.end.lock().unwrap().is_some()
    }

    /// Which stream of the process this is.
    pub(crate) fn serial(&self) -> u64 {
        self.shared.serial
    }

    /// True while requests can still be sent: neither ended nor half-closed.
    pub(crate) fn takes_requests(&self) -> bool {
        !self.is_closed() && self.shared.tx.lock().unwrap().is_some()
    }

    /// Cancels the call at once: the broker sees the stream end, unanswered requests fail and
    /// the receiver gets [`WorkEvent::Closed`] no more (it just ends). For a clean end, use
    /// [`WorkStream::close`] and wait for `Closed` first.
    pub fn cancel(&self) {
        self.close();
        if let Some(reader) = self.shared.reader.lock().unwrap().take() {
            reader.abort();
        }
        let mut end = self.shared.end.lock().unwrap();
        if end.is_none() {
            *end = Some(Status::cancelled("work stream cancelled"));
        }
        drop(end);
        self.shared.pending.lock().unwrap().clear();
    }

    /// Queues `request` on the stream now (so requests keep the order of these calls) and
    /// returns the waiter for its result, to pass to [`WorkStream::finish`].
    fn start(&self, request: Request) -> Result<oneshot::Receiver<v1::WorkResult>, Status> {
        let request_id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (result_tx, result_rx) = oneshot::channel();
        self.shared
            .pending
            .lock()
            .unwrap()
            .insert(request_id, result_tx);
        let sent = match self.shared.tx.lock().unwrap().as_ref() {
            Some(tx) => tx
                .send(v1::WorkRequest {
                    request_id,
                    request: Some(request),
                })
                .is_ok(),
            None => false,
        };
        if !sent {
            self.shared.pending.lock().unwrap().remove(&request_id);
            return Err(self.end_status());
        }
        Ok(result_rx)
    }

    async fn finish(
        &self,
        waiter: oneshot::Receiver<v1::WorkResult>,
    ) -> Result<v1::WorkResult, Status> {
        match waiter.await {
            Ok(result) if result.code == 0 => Ok(result),
            Ok(result) => Err(Status::new(Code::from_i32(result.code), result.message)),
            Err(_) => Err(self.end_status()),
        }
    }

    fn end_status(&self) -> Status {
        self.shared
            .end
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| Status::unavailable("work stream closed"))
    }
}

/// Cancels a stream when dropped (a no-op once it ended), so that a task given up on does not
/// leave its call open.
pub(crate) struct CancelOnDrop(Option<WorkStream>);

impl CancelOnDrop {
    pub(crate) fn new(stream: &WorkStream) -> Self {
        Self(Some(stream.clone()))
    }

    /// Leaves the stream open after all.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(stream) = &self.0 {
            stream.cancel();
        }
    }
}

async fn read_responses(
    mut responses: tonic::Streaming<v1::WorkResponse>,
    shared: Arc<Shared>,
    events: mpsc::UnboundedSender<WorkEvent>,
) {
    let end = loop {
        match responses.message().await {
            Ok(Some(message)) => match message.response {
                Some(Response::Result(result)) => {
                    let waiter = shared.pending.lock().unwrap().remove(&result.request_id);
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(result);
                    }
                }
                Some(Response::Job(job)) => {
                    let _ = events.send(WorkEvent::Job(job));
                }
                // Only sent to a stream that subscribed with batch_pushes; each job is handled
                // as if it came alone.
                Some(Response::JobBatch(batch)) => {
                    for job in batch.jobs {
                        let _ = events.send(WorkEvent::Job(job));
                    }
                }
                Some(Response::LeaseLost(lost)) => {
                    let _ = events.send(WorkEvent::LeaseLost(lost.job_id));
                }
                Some(Response::CancelRequested(notice)) => {
                    let _ = events.send(WorkEvent::CancelRequested(notice.job_id));
                }
                None => {}
            },
            Ok(None) => break None,
            // A connection that broke (a node killed, or one a keepalive ping found dead):
            // UNAVAILABLE, as for a unary call, so that the node is taken as unreachable.
            Err(status) if client::lost_connection(&status) => {
                break Some(Status::unavailable(format!(
                    "the connection was lost: {status}"
                )));
            }
            Err(status) => break Some(status),
        }
    };
    *shared.end.lock().unwrap() = Some(
        end.clone()
            .unwrap_or_else(|| Status::unavailable("work stream closed")),
    );
    // Nothing more can be answered: fail the waiting requests and refuse new ones.
    shared.tx.lock().unwrap().take();
    shared.pending.lock().unwrap().clear();
    let _ = events.send(WorkEvent::Closed(end));
}

/// The README's code blocks are compiled as doc tests, so they stay correct.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
