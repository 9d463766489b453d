//! [`Client`]: both services of the broker, with the options of [`ClientOptions`], safe
//! retries, a short-hand for every call and [`Client::enqueue_and_wait`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

use crate::middleware::{EnqueueNext, ProducerMiddleware};
use crate::options::{ClientOptions, ConnectError, bearer};
use crate::v1::work_request::Request;
use crate::{AdminClient, BrokerClient, CLIENT_NAME, Code, Shared, Status, WorkEvent, WorkStream};
use crate::{duration, read_responses, v1};

/// A call answered `UNAVAILABLE` is sent at most this often in all, when repeating it is safe.
const RETRY_ATTEMPTS: u32 = 3;
/// The pause before the first repeat; it doubles for the next.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// The largest message the clients accept: the broker's own limit (a job of 4 MiB of result
/// and checkpoint beside its payload does not fit in tonic's default of 4 MiB).
const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Extra time a long-poll `Lease` gets beyond its `wait`, for the answer to come back.
const LEASE_DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// Adds the `jobbroker-client` metadata (the broker shows it in `Admin.ListWorkers`) and, when
/// one is configured, `authorization: Bearer <token>` to every call of the clients a
/// [`Client`] hands out.
#[derive(Clone, Debug, Default)]
pub struct ClientTag {
    authorization: Option<AsciiMetadataValue>,
}

impl tonic::service::Interceptor for ClientTag {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let metadata = request.metadata_mut();
        metadata.insert(
            "jobbroker-client",
            tonic::metadata::MetadataValue::from_static(CLIENT_NAME),
        );
        if let Some(authorization) = &self.authorization {
            metadata.insert("authorization", authorization.clone());
        }
        Ok(request)
    }
}

/// Whether a call may be sent again after `UNAVAILABLE`: only when a repeat cannot do the
/// work twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Repeat {
    /// Reads, answers about a lease (the broker answers a repeated ack of the same lease OK),
    /// setting a queue's policy or a schedule, and enqueues whose every job has a dedup key.
    Safe,
    /// Everything else: an enqueue without a dedup key could create the job twice, a repeated
    /// cancel, retry, delete or purge could report a failure for work that was done.
    Never,
}

/// The broker's nodes as a client sees them.
struct Nodes {
    /// Each address as given, with its channel (it connects on first use and again after a
    /// failure).
    channels: Vec<(String, Channel)>,
    /// Where calls go now: the next one after a call was answered `UNAVAILABLE`.
    current: AtomicUsize,
}

impl Nodes {
    fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.channels.len()
    }

    /// `index` answered `UNAVAILABLE`: move on to the next node, unless another call already
    /// did (two calls failing together skip one node, not two).
    fn unavailable(&self, index: usize) {
        let next = (index + 1) % self.channels.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// The generated clients of one node, tagged.
struct Stubs {
    broker: BrokerClient,
    admin: AdminClient,
}

/// Both services of the broker, over one HTTP/2 channel per address. Cheap to clone: clones
/// share the channels and the current node. Safe to use from many tasks.
///
/// Made from [`ClientOptions`] (addresses, TLS, token, deadline) by [`Client::new`] or
/// [`Client::connect`]. Unary calls get the options' deadline (10 s by default; change it for
/// some calls with [`Client::with_deadline`]) and are sent again after `UNAVAILABLE` (3
/// attempts in all, 100 ms then 200 ms apart, each on the next address) only when a repeat
/// cannot do the work twice: reads, `ack`/`fail`/`release`/`heartbeat`, setting a queue's
/// policy or a schedule, and enqueues whose every job has a dedup key. Anything else, an
/// enqueue without a dedup key first, is sent once and its error returned.
#[derive(Clone)]
pub struct Client {
    nodes: Arc<Nodes>,
    tag: ClientTag,
    deadline: Duration,
    producer: Arc<[ProducerMiddleware]>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addresses: Vec<&str> = self
            .nodes
            .channels
            .iter()
            .map(|(a, _)| a.as_str())
            .collect();
        f.debug_struct("Client")
            .field("addresses", &addresses)
            .field("current", &self.nodes.current())
            .field("deadline", &self.deadline)
            .field("token", &self.tag.authorization.as_ref().map(|_| "<set>"))
            .field("producer_middleware", &self.producer.len())
            .finish()
    }
}

/// Why [`Client::enqueue_and_wait`] or [`Client::wait_for_job`] did not return a completed
/// job.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// A call failed (the enqueue, or watching the job).
    #[error("{0}")]
    Status(#[from] Status),
    /// The job ended FAILED or CANCELLED; the message names the state, the fail reason and
    /// the last error.
    #[error("job {} ended {}{}{}", .0.id, state_name(.0.state), fail_reason_of(.0), last_error_of(.0))]
    Ended(Box<v1::Job>),
    /// The job had not ended when the time given ran out (it goes on: watch it again, or
    /// cancel it).
    #[error("job {job_id} had not ended after {timeout:?}")]
    Timeout {
        /// The job waited for.
        job_id: String,
        /// The time given.
        timeout: Duration,
    },
}

impl WaitError {
    /// The job, when it ended FAILED or CANCELLED.
    pub fn job(&self) -> Option<&v1::Job> {
        match self {
            Self::Ended(job) => Some(job),
            _ => None,
        }
    }
}

fn state_name(state: i32) -> &'static str {
    v1::JobState::try_from(state).map_or("in an unknown state", |s| s.as_str_name())
}

fn fail_reason_of(job: &v1::Job) -> String {
    match v1::FailReason::try_from(job.fail_reason) {
        Ok(v1::FailReason::Unspecified) | Err(_) => String::new(),
        Ok(reason) => format!(" ({})", reason.as_str_name()),
    }
}

fn last_error_of(job: &v1::Job) -> String {
    if job.last_error.is_empty() {
        String::new()
    } else {
        format!(": {}", job.last_error)
    }
}

fn is_terminal(state: i32) -> bool {
    matches!(
        v1::JobState::try_from(state),
        Ok(v1::JobState::Completed | v1::JobState::Failed | v1::JobState::Cancelled)
    )
}

fn deadline_exceeded(deadline: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "the call did not end within its deadline of {deadline:?}"
    ))
}

impl Client {
    /// A client for `options` (an address converts into options). Connects on first use, and
    /// again after failures; fails only for options that cannot work (a malformed address, an
    /// unreadable certificate file, a certificate without TLS, a token that cannot be sent).
    pub fn new(options: impl Into<ClientOptions>) -> Result<Self, ConnectError> {
        let resolved = options.into().resolve(|name| std::env::var(name).ok())?;
        let channels = resolved
            .endpoints
            .into_iter()
            .map(|(address, endpoint)| (address, endpoint.connect_lazy()))
            .collect();
        Ok(Self::over(
            channels,
            resolved.authorization,
            resolved.deadline,
        ))
    }

    /// Like [`Client::new`], and connects now: the addresses in order, until one answers. Fails
    /// with [`ConnectError::Unreachable`] when none does.
    pub async fn connect(options: impl Into<ClientOptions>) -> Result<Self, ConnectError> {
        let resolved = options.into().resolve(|name| std::env::var(name).ok())?;
        let mut first_reached = None;
        let mut last_error = None;
        let mut channels = Vec::with_capacity(resolved.endpoints.len());
        for (index, (address, endpoint)) in resolved.endpoints.into_iter().enumerate() {
            let channel = if first_reached.is_none() {
                match endpoint.connect().await {
                    Ok(channel) => {
                        first_reached = Some(index);
                        channel
                    }
                    Err(error) => {
                        last_error = Some((address.clone(), error));
                        endpoint.connect_lazy()
                    }
                }
            } else {
                endpoint.connect_lazy()
            };
            channels.push((address, channel));
        }
        let Some(first_reached) = first_reached else {
            let (address, source) = last_error.expect("at least one address");
            return Err(ConnectError::Unreachable { address, source });
        };
        let client = Self::over(channels, resolved.authorization, resolved.deadline);
        client.nodes.current.store(first_reached, Ordering::Relaxed);
        Ok(client)
    }

    /// Wraps a channel the caller configured, with no token and the default deadline.
    pub fn from_channel(channel: Channel) -> Self {
        Self::over(
            vec![("<channel>".into(), channel)],
            None,
            crate::DEFAULT_DEADLINE,
        )
    }

    fn over(
        channels: Vec<(String, Channel)>,
        authorization: Option<AsciiMetadataValue>,
        deadline: Duration,
    ) -> Self {
        Self {
            nodes: Arc::new(Nodes {
                channels,
                current: AtomicUsize::new(0),
            }),
            tag: ClientTag { authorization },
            deadline,
            producer: Arc::from(Vec::new()),
        }
    }

    /// This client, with every call carrying `authorization: Bearer <token>` instead. Shares
    /// the channels. `INVALID_ARGUMENT` if the token cannot be sent as metadata (empty, or
    /// not visible ASCII).
    pub fn with_token(&self, token: &str) -> Result<Self, Status> {
        let authorization = bearer(token)
            .ok_or_else(|| Status::invalid_argument("the token is empty or not visible ASCII"))?;
        Ok(Self {
            tag: ClientTag {
                authorization: Some(authorization),
            },
            ..self.clone()
        })
    }

    /// This client, with `deadline` for its unary calls (the per-call override: keep the
    /// result for the calls that need it). Shares the channels.
    pub fn with_deadline(&self, deadline: Duration) -> Self {
        Self {
            deadline,
            ..self.clone()
        }
    }

    /// The deadline of this client's unary calls.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// This client, with `middleware` wrapping every [`Client::enqueue`] (and each job of
    /// [`Client::enqueue_batch`]) inside those added before: the first added is the
    /// outermost. It may change the request (add headers, say), answer without calling
    /// `next`, or look at the answer. Shares the channels.
    ///
    /// ```
    /// # fn demo(client: jobbroker::Client) {
    /// let client = client.with_producer_middleware(|mut request, next| {
    ///     request.headers.insert("tenant".into(), "acme".into());
    ///     next.run(request)
    /// });
    /// # }
    /// ```
    pub fn with_producer_middleware<F, Fut>(&self, middleware: F) -> Self
    where
        F: Fn(v1::EnqueueRequest, EnqueueNext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<v1::EnqueueResponse, Status>> + Send + 'static,
    {
        let middleware: ProducerMiddleware =
            Arc::new(move |request, next| Box::pin(middleware(request, next)));
        let mut chain: Vec<ProducerMiddleware> = self.producer.to_vec();
        chain.push(middleware);
        Self {
            producer: Arc::from(chain),
            ..self.clone()
        }
    }

    fn stubs(&self, index: usize) -> Stubs {
        let channel = self.nodes.channels[index].1.clone();
        Stubs {
            broker: v1::broker_client::BrokerClient::with_interceptor(
                channel.clone(),
                self.tag.clone(),
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
            admin: v1::admin_client::AdminClient::with_interceptor(channel, self.tag.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        }
    }

    /// The generated Broker client of the current node (sharing this client's channel, token
    /// and metadata; no deadline, no retries).
    pub fn broker(&self) -> BrokerClient {
        self.stubs(self.nodes.current()).broker
    }

    /// The generated Admin client of the current node (sharing this client's channel, token
    /// and metadata; no deadline, no retries).
    pub fn admin(&self) -> AdminClient {
        self.stubs(self.nodes.current()).admin
    }

    /// The address calls go to now.
    pub fn current_address(&self) -> &str {
        &self.nodes.channels[self.nodes.current()].0
    }

    /// Sends one call: to the current node, within `deadline` (`None`: a stream, which has
    /// none), again on the next node after `UNAVAILABLE` when `repeat` allows.
    async fn call<M, R, F, Fut>(
        &self,
        repeat: Repeat,
        deadline: Option<Duration>,
        message: M,
        call: F,
    ) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Stubs, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        // A deadline too far to represent (Duration::MAX) is none.
        let end = deadline.and_then(|d| Instant::now().checked_add(d));
        let attempts = match repeat {
            Repeat::Safe => RETRY_ATTEMPTS,
            Repeat::Never => 1,
        };
        let mut pause = RETRY_BACKOFF;
        let mut attempt = 1;
        loop {
            let index = self.nodes.current();
            let mut request = tonic::Request::new(message.clone());
            if let Some(end) = end {
                // grpc-timeout, so that the broker gives up when the caller does.
                request.set_timeout(end.saturating_duration_since(Instant::now()));
            }
            let sent = call(self.stubs(index), request);
            let answer = match (end, deadline) {
                (Some(end), Some(deadline)) => match tokio::time::timeout_at(end, sent).await {
                    Ok(answer) => answer,
                    Err(_) => return Err(deadline_exceeded(deadline)),
                },
                _ => sent.await,
            };
            let status = match answer {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            if let (Some(end), Some(deadline)) = (end, deadline)
                && Instant::now() >= end
            {
                // tonic's own timer for grpc-timeout ends the call CANCELLED: it is the deadline.
                return Err(deadline_exceeded(deadline));
            }
            if status.code() != Code::Unavailable {
                return Err(status);
            }
            self.nodes.unavailable(index);
            if attempt >= attempts {
                return Err(status);
            }
            attempt += 1;
            let wake = Instant::now() + pause;
            if end.is_some_and(|end| wake >= end) {
                return Err(status);
            }
            tokio::time::sleep_until(wake).await;
            pause *= 2;
        }
    }

    /// A unary call with this client's deadline.
    async fn unary<M, R, F, Fut>(&self, repeat: Repeat, message: M, call: F) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Stubs, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        self.call(repeat, Some(self.deadline), message, call).await
    }

    // ---- Broker: producers ----

    /// Enqueues one job; see [`job`](crate::job) and the `with_` methods of
    /// [`v1::EnqueueRequest`] to build the request. Goes through the producer middleware
    /// first. `INVALID_ARGUMENT` names a malformed field, `ALREADY_EXISTS` means the dedup key
    /// is held by a job with another payload, `RESOURCE_EXHAUSTED` a full queue or a payload
    /// too large. Sent again after `UNAVAILABLE` only when the job has a dedup key (a repeat
    /// then finds the job the first one made).
    pub async fn enqueue(
        &self,
        request: v1::EnqueueRequest,
    ) -> Result<v1::EnqueueResponse, Status> {
        EnqueueNext::start(self.clone(), self.producer.clone())
            .run(request)
            .await
    }

    /// The enqueue itself, past the producer middleware.
    pub(crate) async fn send_enqueue(
        &self,
        request: v1::EnqueueRequest,
    ) -> Result<v1::EnqueueResponse, Status> {
        let repeat = if request.dedup_key.is_empty() {
            Repeat::Never
        } else {
            Repeat::Safe
        };
        self.unary(repeat, request, |mut s, r| async move {
            s.broker.enqueue(r).await
        })
        .await
    }

    /// Enqueues 1 to 1000 jobs, all or nothing; one result per job, in order. Each job goes
    /// through the producer middleware first (a middleware's own answer is not used: the batch
    /// is one call). Sent again after `UNAVAILABLE` only when every job has a dedup key.
    pub async fn enqueue_batch(
        &self,
        jobs: Vec<v1::EnqueueRequest>,
    ) -> Result<Vec<v1::EnqueueResponse>, Status> {
        let mut prepared = Vec::with_capacity(jobs.len());
        for job in jobs {
            prepared.push(crate::middleware::prepare(&self.producer, job).await?);
        }
        let repeat = if prepared.iter().all(|j| !j.dedup_key.is_empty()) {
            Repeat::Safe
        } else {
            Repeat::Never
        };
        let request = v1::EnqueueBatchRequest { jobs: prepared };
        let response = self
            .unary(repeat, request, |mut s, r| async move {
                s.broker.enqueue_batch(r).await
            })
            .await?;
        Ok(response.results)
    }

    /// Enqueues the job, then watches it until it ends: the job COMPLETED (its `result` is the
    /// handler's), or [`WaitError::Ended`] naming FAILED or CANCELLED, or
    /// [`WaitError::Timeout`] when `timeout` (if any) ran out first (the job goes on).
    pub async fn enqueue_and_wait(
        &self,
        request: v1::EnqueueRequest,
        timeout: Option<Duration>,
    ) -> Result<v1::Job, WaitError> {
        let start = Instant::now();
        let sent = self.enqueue(request).await?;
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        self.wait_for_job(&sent.job_id, left)
            .await
            .map_err(|error| match (error, timeout) {
                // Name the whole time given, not what was left of it.
                (WaitError::Timeout { job_id, .. }, Some(timeout)) => {
                    WaitError::Timeout { job_id, timeout }
                }
                (error, _) => error,
            })
    }

    /// Watches a job (`Admin.WatchJob`) until it ends; what [`Client::enqueue_and_wait`]
    /// returns. A watch the broker ends with `UNAVAILABLE` (it shut down, or a leader moved)
    /// is opened again.
    pub async fn wait_for_job(
        &self,
        job_id: &str,
        timeout: Option<Duration>,
    ) -> Result<v1::Job, WaitError> {
        let watching = async {
            let mut pause = RETRY_BACKOFF;
            loop {
                let mut updates = self.watch_job(job_id).await?;
                loop {
                    match updates.message().await {
                        Ok(Some(job)) if is_terminal(job.state) => {
                            return if job.state == v1::JobState::Completed as i32 {
                                Ok(job)
                            } else {
                                Err(WaitError::Ended(Box::new(job)))
                            };
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(status) if status.code() == Code::Unavailable => break,
                        Err(status) => return Err(status.into()),
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        };
        match timeout {
            None => watching.await,
            Some(timeout) => tokio::time::timeout(timeout, watching)
                .await
                .unwrap_or_else(|_| {
                    Err(WaitError::Timeout {
                        job_id: job_id.to_string(),
                        timeout,
                    })
                }),
        }
    }

    // ---- Broker: workers (unary; the Worker uses the Work stream) ----

    /// Leases up to `max_jobs` (0: 1) ready jobs of `queue`, waiting up to `wait` (at most
    /// 60 s) for one; empty when none was ready in time. The call's deadline is this client's
    /// plus `wait`. Never sent twice: a repeat could lease jobs nobody then works on.
    pub async fn lease(
        &self,
        queue: &str,
        worker_id: &str,
        max_jobs: i32,
        lease: Option<Duration>,
        wait: Duration,
    ) -> Result<Vec<v1::LeasedJob>, Status> {
        let request = v1::LeaseRequest {
            queue: queue.into(),
            worker_id: worker_id.into(),
            max_jobs,
            lease_duration: lease.map(duration),
            wait: (!wait.is_zero()).then(|| duration(wait)),
        };
        let deadline = self
            .deadline
            .saturating_add(wait)
            .saturating_add(LEASE_DEADLINE_MARGIN);
        let response = self
            .call(
                Repeat::Never,
                Some(deadline),
                request,
                |mut s, r| async move { s.broker.lease(r).await },
            )
            .await?;
        Ok(response.jobs)
    }

    /// Extends a lease (and saves a checkpoint or progress when set). `FAILED_PRECONDITION`
    /// once the lease is gone.
    pub async fn heartbeat(
        &self,
        request: v1::HeartbeatRequest,
    ) -> Result<v1::HeartbeatResponse, Status> {
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.broker.heartbeat(r).await
        })
        .await
    }

    /// Completes a leased job with `result`. `FAILED_PRECONDITION` for a stale lease.
    pub async fn ack(&self, job: &v1::LeasedJob, result: Vec<u8>) -> Result<(), Status> {
        let request = v1::AckRequest {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            result,
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.broker.ack(r).await
        })
        .await
        .map(|_| ())
    }

    /// Fails this attempt of a leased job: retried after the queue's backoff (or
    /// `retry_after`), unless `permanent` or no attempts are left.
    pub async fn fail(
        &self,
        job: &v1::LeasedJob,
        error: &str,
        permanent: bool,
        retry_after: Option<Duration>,
    ) -> Result<v1::FailResponse, Status> {
        let request = v1::FailRequest {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            error: error.to_string(),
            permanent,
            retry_after: retry_after.map(duration),
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.broker.fail(r).await
        })
        .await
    }

    /// Gives a leased job back unstarted: READY again (with `delay`, a snooze: SCHEDULED that
    /// much later), no attempt spent.
    pub async fn release(
        &self,
        job: &v1::LeasedJob,
        delay: Option<Duration>,
    ) -> Result<(), Status> {
        let request = v1::ReleaseRequest {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            delay: delay.map(duration),
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.broker.release(r).await
        })
        .await
        .map(|_| ())
    }

    /// Opens a `Work` stream and subscribes. Returns once the broker accepted the subscription;
    /// a refusal (e.g. `INVALID_ARGUMENT` for a bad queue name, `UNAVAILABLE` while a queue's
    /// partition has no leader) ends the stream and is returned as its status.
    /// Pushed jobs and notices arrive on the returned receiver, which ends with
    /// [`WorkEvent::Closed`]. Must be called inside a Tokio runtime (it spawns the reader).
    pub async fn work(
        &self,
        subscribe: v1::SubscribeRequest,
    ) -> Result<(WorkStream, mpsc::UnboundedReceiver<WorkEvent>), Status> {
        let node = self.nodes.current();
        let opened = self.work_on(node, subscribe).await;
        if let Err(status) = &opened
            && status.code() == Code::Unavailable
        {
            self.nodes.unavailable(node);
        }
        opened
    }

    async fn work_on(
        &self,
        node: usize,
        subscribe: v1::SubscribeRequest,
    ) -> Result<(WorkStream, mpsc::UnboundedReceiver<WorkEvent>), Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = WorkStream {
            shared: Arc::new(Shared {
                tx: Mutex::new(Some(tx)),
                next_id: AtomicU64::new(1),
                pending: Mutex::new(HashMap::new()),
                end: Mutex::new(None),
                reader: Mutex::new(None),
                node,
            }),
        };
        let subscribed = stream.start(Request::Subscribe(subscribe))?;
        let responses = self
            .stubs(node)
            .broker
            .work(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await?
            .into_inner();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_responses(responses, stream.shared.clone(), events_tx));
        *stream.shared.reader.lock().unwrap() = Some(reader.abort_handle());
        if let Err(status) = stream.finish(subscribed).await {
            // Refused while the stream stays open (UNAVAILABLE: a queue's partition has no
            // leader yet; or a code retrying would not change): it will never push, so end it
            // here. The caller takes it as a stream that ended with this code.
            stream.cancel();
            return Err(status);
        }
        Ok((stream, events_rx))
    }

    /// A `Work` stream of this client ended with `UNAVAILABLE`: the next one goes to the next
    /// address.
    pub(crate) fn work_stream_unavailable(&self, stream: &WorkStream) {
        self.nodes.unavailable(stream.shared.node);
    }

    // ---- Admin: jobs ----

    /// The job as it is now (state, attempts, result, checkpoint, progress, ...). `NOT_FOUND`
    /// for an unknown id.
    pub async fn get_job(&self, job_id: &str) -> Result<v1::Job, Status> {
        let request = v1::GetJobRequest {
            job_id: job_id.into(),
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.admin.get_job(r).await
        })
        .await
    }

    /// The job as it is now, then one message per change, ending after the one that shows a
    /// terminal state. No deadline; opening it is retried like a read. A stream the broker
    /// ends with `UNAVAILABLE` (it shut down) can be watched again.
    pub async fn watch_job(&self, job_id: &str) -> Result<tonic::Streaming<v1::Job>, Status> {
        let request = v1::WatchJobRequest {
            job_id: job_id.into(),
        };
        self.call(Repeat::Safe, None, request, |mut s, r| async move {
            s.admin.watch_job(r).await
        })
        .await
    }

    /// One page of the jobs of a queue (in one state, or all), oldest first unless
    /// `newest_first`; `next_page_token` is empty on the last page.
    pub async fn list_jobs(
        &self,
        request: v1::ListJobsRequest,
    ) -> Result<v1::ListJobsResponse, Status> {
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.admin.list_jobs(r).await
        })
        .await
    }

    /// Cancels a job: READY or SCHEDULED ones at once, an ACTIVE one through its worker
    /// (`cancel_requested`). `FAILED_PRECONDITION` if it has already ended.
    pub async fn cancel_job(&self, job_id: &str) -> Result<v1::Job, Status> {
        let request = v1::CancelJobRequest {
            job_id: job_id.into(),
        };
        self.unary(Repeat::Never, request, |mut s, r| async move {
            s.admin.cancel_job(r).await
        })
        .await
    }

    /// A FAILED or CANCELLED job back to READY, attempts reset; the job after it.
    pub async fn retry_job(&self, job_id: &str) -> Result<v1::Job, Status> {
        let request = v1::RetryJobRequest {
            job_id: job_id.into(),
            ..Default::default()
        };
        let response = self.retry_jobs(request).await?;
        response
            .job
            .ok_or_else(|| Status::internal("RetryJob answered without the job"))
    }

    /// `Admin.RetryJob` in full: with `queue` set, a bulk redrive of the queue's FAILED (or
    /// CANCELLED) jobs, `dry_run` to count them only.
    pub async fn retry_jobs(
        &self,
        request: v1::RetryJobRequest,
    ) -> Result<v1::RetryJobResponse, Status> {
        self.unary(Repeat::Never, request, |mut s, r| async move {
            s.admin.retry_job(r).await
        })
        .await
    }

    /// Removes a job that is not ACTIVE (`FAILED_PRECONDITION`: cancel it first).
    pub async fn delete_job(&self, job_id: &str) -> Result<(), Status> {
        let request = v1::DeleteJobRequest {
            job_id: job_id.into(),
        };
        self.unary(Repeat::Never, request, |mut s, r| async move {
            s.admin.delete_job(r).await
        })
        .await
        .map(|_| ())
    }

    // ---- Admin: queues ----

    /// Every queue (that the token may see), by name.
    pub async fn list_queues(&self) -> Result<Vec<v1::QueueInfo>, Status> {
        let response = self
            .unary(
                Repeat::Safe,
                v1::ListQueuesRequest {},
                |mut s, r| async move { s.admin.list_queues(r).await },
            )
            .await?;
        Ok(response.queues)
    }

    /// A queue's effective policy, counts by state, oldest ready age, totals.
    pub async fn get_queue(&self, queue: &str) -> Result<v1::QueueInfo, Status> {
        let request = v1::GetQueueRequest {
            queue: queue.into(),
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.admin.get_queue(r).await
        })
        .await
    }

    /// Changes a queue's policy at run time (the fields set in `policy`; with `reset`, the
    /// run-time overrides are dropped first). Creates the queue if it is new.
    pub async fn update_queue_policy(
        &self,
        request: v1::UpdateQueuePolicyRequest,
    ) -> Result<v1::QueueInfo, Status> {
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.admin.update_queue_policy(r).await
        })
        .await
    }

    /// Stops leasing from the queue (enqueues are still taken).
    pub async fn pause_queue(&self, queue: &str) -> Result<v1::QueueInfo, Status> {
        let request = v1::PauseQueueRequest {
            queue: queue.into(),
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.admin.pause_queue(r).await
        })
        .await
    }

    /// Leases from the queue again.
    pub async fn resume_queue(&self, queue: &str) -> Result<v1::QueueInfo, Status> {
        let request = v1::ResumeQueueRequest {
            queue: queue.into(),
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.admin.resume_queue(r).await
        })
        .await
    }

    /// Removes the queue's jobs in `states` (none given: every terminal state); how many.
    pub async fn purge_queue(&self, queue: &str, states: &[v1::JobState]) -> Result<i64, Status> {
        let request = v1::PurgeQueueRequest {
            queue: queue.into(),
            states: states.iter().map(|s| *s as i32).collect(),
        };
        let response = self
            .unary(Repeat::Never, request, |mut s, r| async move {
                s.admin.purge_queue(r).await
            })
            .await?;
        Ok(response.purged)
    }

    // ---- Admin: cluster and workers ----

    /// The nodes and each partition's leader (a single node answers as a cluster of one).
    pub async fn get_cluster(&self) -> Result<v1::ClusterInfo, Status> {
        self.unary(
            Repeat::Safe,
            v1::GetClusterRequest {},
            |mut s, r| async move { s.admin.get_cluster(r).await },
        )
        .await
    }

    /// The workers connected now (of `queue` only, if given): their streams, queues, running
    /// attempts and the library they say they are.
    pub async fn list_workers(&self, queue: Option<&str>) -> Result<Vec<v1::WorkerInfo>, Status> {
        let request = v1::ListWorkersRequest {
            queue: queue.unwrap_or_default().into(),
        };
        let response = self
            .unary(Repeat::Safe, request, |mut s, r| async move {
                s.admin.list_workers(r).await
            })
            .await?;
        Ok(response.workers)
    }

    // ---- Admin: schedules ----

    /// Creates or replaces a recurring schedule; the schedule as stored (next run time, ...).
    pub async fn put_schedule(&self, schedule: v1::Schedule) -> Result<v1::Schedule, Status> {
        let request = v1::PutScheduleRequest {
            schedule: Some(schedule),
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.admin.put_schedule(r).await
        })
        .await
    }

    /// One schedule; `NOT_FOUND` for an unknown id.
    pub async fn get_schedule(&self, schedule_id: &str) -> Result<v1::Schedule, Status> {
        let request = v1::GetScheduleRequest {
            schedule_id: schedule_id.into(),
        };
        self.unary(Repeat::Safe, request, |mut s, r| async move {
            s.admin.get_schedule(r).await
        })
        .await
    }

    /// Every schedule (whose template enqueues into `queue`, if given), by id.
    pub async fn list_schedules(&self, queue: Option<&str>) -> Result<Vec<v1::Schedule>, Status> {
        let request = v1::ListSchedulesRequest {
            queue: queue.unwrap_or_default().into(),
        };
        let response = self
            .unary(Repeat::Safe, request, |mut s, r| async move {
                s.admin.list_schedules(r).await
            })
            .await?;
        Ok(response.schedules)
    }

    /// Removes a schedule; the jobs it enqueued stay.
    pub async fn delete_schedule(&self, schedule_id: &str) -> Result<(), Status> {
        let request = v1::DeleteScheduleRequest {
            schedule_id: schedule_id.into(),
        };
        self.unary(Repeat::Never, request, |mut s, r| async move {
            s.admin.delete_schedule(r).await
        })
        .await
        .map(|_| ())
    }

    /// Enqueues one run of the schedule now; the job (or the one already holding the run's
    /// dedup key).
    pub async fn trigger_schedule(
        &self,
        schedule_id: &str,
    ) -> Result<v1::TriggerScheduleResponse, Status> {
        let request = v1::TriggerScheduleRequest {
            schedule_id: schedule_id.into(),
        };
        self.unary(Repeat::Never, request, |mut s, r| async move {
            s.admin.trigger_schedule(r).await
        })
        .await
    }
}
