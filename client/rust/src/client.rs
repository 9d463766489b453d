//! [`Client`]: both services of the broker, with the options of [`ClientOptions`], safe
//! retries, a short-hand for every call and [`Client::enqueue_and_wait`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

use crate::coalescer::{Batch, Coalescer, Key, Outcome, Place, SendBatch};
use crate::middleware::{EnqueueNext, ProducerMiddleware};
use crate::options::{BatchOptions, ClientOptions, ConnectError, bearer};
use crate::router::{Route, Router, Target, unreachable};
use crate::routing_table::StreamGroup;
use crate::v1::work_request::Request;
use crate::{
    AdminClient, BrokerClient, CLIENT_NAME, CancelOnDrop, Code, Shared, Status, WorkEvent,
    WorkStream,
};
use crate::{duration, partition_of_queue, read_responses, v1};

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

/// How long one `Admin.GetCluster` of the router may take at most (less when the client's
/// deadline is shorter).
const MAX_FETCH_DEADLINE: Duration = Duration::from_secs(10);

/// Told the address of the node each call (and each `Work` stream) is sent to; see
/// [`Client::with_target_observer`].
type TargetObserver = Arc<dyn Fn(&str) + Send + Sync>;

/// The generated clients of one node, tagged.
struct Stubs {
    broker: BrokerClient,
    admin: AdminClient,
}

/// Both services of the broker, over one HTTP/2 channel per address. Cheap to clone: clones
/// share the channels and the routing. Safe to use from many tasks.
///
/// In a cluster each call goes straight to the leader of its partition: of its queue
/// (enqueue, lease, the queue's admin calls, a batch by its first job's queue) or of its job
/// (get, watch, cancel, retry, delete, answers about a lease); the other calls go to any node.
/// The client learns the leaders from `Admin.GetCluster` before its first call, and again
/// before the next call after one failed `UNAVAILABLE` or `DEADLINE_EXCEEDED`. A broker
/// outside a cluster, or one that refuses `GetCluster` (an older broker, a token without the
/// admin role), gets every call, the addresses given serving in turn as below.
///
/// Made from [`ClientOptions`] (addresses, TLS, token, deadline, keepalive) by [`Client::new`] or
/// [`Client::connect`]. Unary calls get the options' deadline (10 s by default; change it for
/// some calls with [`Client::with_deadline`]) and are sent again after `UNAVAILABLE` (3
/// attempts in all, 100 ms then 200 ms apart, each routed afresh) only when a repeat
/// cannot do the work twice: reads, `ack`/`fail`/`release`/`heartbeat`, setting a queue's
/// policy or a schedule, and enqueues whose every job has a dedup key. Anything else, an
/// enqueue without a dedup key first, is sent once and its error returned.
///
/// Concurrent [`Client::enqueue`] calls are merged into `EnqueueBatch` calls, each caller
/// still getting its own answer (`docs/worker-contract.md` §10; the `batch` options of
/// [`ClientOptions`], [`Client::with_batching`] to turn it off for some calls).
/// [`Client::close`] sends what is still gathering and waits for the batches in flight.
#[derive(Clone)]
pub struct Client {
    router: Arc<Router>,
    tag: ClientTag,
    deadline: Duration,
    producer: Arc<[ProducerMiddleware]>,
    observer: Option<TargetObserver>,
    /// Whether this clone's enqueues go through `coalescer`.
    batching: bool,
    /// Shared by the clones that send with the same token and observer.
    coalescer: Arc<Coalescer>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addresses", &self.router.given())
            .field("current", &self.router.current().address)
            .field("deadline", &self.deadline)
            .field("token", &self.tag.authorization.as_ref().map(|_| "<set>"))
            .field("producer_middleware", &self.producer.len())
            .field("batching", &self.batching)
            .field("batch_options", self.coalescer.options())
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

/// Whether tonic failed the call on its connection (e.g. a broken pipe to a node just
/// killed, or a connection closed after a keepalive ping went unanswered): `UNKNOWN` carrying
/// the error underneath (tonic's transport error, or hyper's when the connection broke while
/// an answer or a stream was being read), where gRPC itself would say `UNAVAILABLE`, which is
/// what the caller and the retry rules get. A status the broker sent carries no error.
pub(crate) fn lost_connection(status: &Status) -> bool {
    status.code() == Code::Unknown && std::error::Error::source(status).is_some()
}

/// How long the router's `GetCluster` may take for a client whose calls have `deadline`.
fn fetch_deadline(deadline: Duration) -> Duration {
    deadline.min(MAX_FETCH_DEADLINE)
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
        let router = Router::new(
            channels,
            resolved.tls,
            resolved.keepalive,
            fetch_deadline(resolved.deadline),
        );
        Ok(Self::over(
            router,
            resolved.authorization,
            resolved.deadline,
            resolved.batch,
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
        let router = Router::new(
            channels,
            resolved.tls,
            resolved.keepalive,
            fetch_deadline(resolved.deadline),
        );
        router.start_at(first_reached);
        Ok(Self::over(
            router,
            resolved.authorization,
            resolved.deadline,
            resolved.batch,
        ))
    }

    /// Wraps a channel the caller configured, with no token, the default deadline and the
    /// default batching. Every call goes over it: no routing in a cluster (its node forwards
    /// calls to their leaders); a coalesced batch holds the jobs of one queue. The channel
    /// keeps its own settings, keepalive included (none unless its `Endpoint` has
    /// `http2_keep_alive_interval`: see [`ClientOptions::keepalive`]).
    pub fn from_channel(channel: Channel) -> Self {
        Self::over(
            Router::fixed(channel),
            None,
            crate::DEFAULT_DEADLINE,
            BatchOptions::default(),
        )
    }

    fn over(
        router: Router,
        authorization: Option<AsciiMetadataValue>,
        deadline: Duration,
        batch: BatchOptions,
    ) -> Self {
        Self {
            router: Arc::new(router),
            tag: ClientTag { authorization },
            deadline,
            producer: Arc::from(Vec::new()),
            observer: None,
            batching: batch.enabled,
            coalescer: Arc::new(Coalescer::new(batch)),
        }
    }

    /// A coalescer of its own, with the same options: for a clone whose calls go out
    /// differently (another token, an observer), whose jobs must not share others' batches.
    fn own_coalescer(&self) -> Arc<Coalescer> {
        Arc::new(Coalescer::new(self.coalescer.options().clone()))
    }

    /// This client, telling `observer` the address of the node each attempt of a call (and
    /// each `Work` stream) is sent to, before it is sent; for tests that check where calls
    /// go. The client's own `GetCluster` calls are not told. Shares the channels.
    #[doc(hidden)]
    pub fn with_target_observer(&self, observer: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self {
            observer: Some(Arc::new(observer)),
            coalescer: self.own_coalescer(),
            ..self.clone()
        }
    }

    /// This client, with every call carrying `authorization: Bearer <token>` instead. Shares
    /// the channels; its enqueues are batched apart from this client's ([`Client::close`] each
    /// of the two). `INVALID_ARGUMENT` if the token cannot be sent as metadata (empty, or not
    /// visible ASCII).
    pub fn with_token(&self, token: &str) -> Result<Self, Status> {
        let authorization = bearer(token)
            .ok_or_else(|| Status::invalid_argument("the token is empty or not visible ASCII"))?;
        Ok(Self {
            tag: ClientTag {
                authorization: Some(authorization),
            },
            coalescer: self.own_coalescer(),
            ..self.clone()
        })
    }

    /// This client, with enqueue coalescing on or off for its [`Client::enqueue`] calls (the
    /// per-call switch: `client.with_batching(false).enqueue(job)` sends one unary `Enqueue`
    /// at once). Shares the channels and, when on, the batches of this client.
    pub fn with_batching(&self, on: bool) -> Self {
        Self {
            batching: on,
            ..self.clone()
        }
    }

    /// Sends the enqueues still gathering in batches and waits until every batch in flight
    /// has been answered (`docs/worker-contract.md` §10, "Closing"); call it before the
    /// program ends. Shared by the clones that share the batches. Enqueues after it are sent
    /// alone, as unary `Enqueue` calls; the channels stay usable and close when the last
    /// clone is dropped.
    pub async fn close(&self) {
        self.coalescer.close(self).await;
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

    fn stubs(&self, channel: Channel) -> Stubs {
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
    /// and metadata; no deadline, no retries, no routing: in a cluster the node forwards a
    /// call to its partition's leader).
    pub fn broker(&self) -> BrokerClient {
        self.stubs(self.router.current().channel).broker
    }

    /// The generated Admin client of the current node (sharing this client's channel, token
    /// and metadata; no deadline, no retries, no routing).
    pub fn admin(&self) -> AdminClient {
        self.stubs(self.router.current().channel).admin
    }

    /// The address calls that any node serves go to now: the node that last answered
    /// `GetCluster`, or before any did, the given address in use.
    pub fn current_address(&self) -> String {
        self.router.current().address
    }

    /// The node for `route`, told to the observer.
    async fn target(&self, route: Route<'_>) -> Target {
        let target = self.router.target(route, &self.tag).await;
        if let Some(observer) = &self.observer {
            observer(&target.address);
        }
        target
    }

    /// Sends one call: to the node of `route`, within `deadline` (`None`: a stream, which has
    /// none), again after `UNAVAILABLE` when `repeat` allows, routed anew.
    async fn call<M, R, F, Fut>(
        &self,
        repeat: Repeat,
        deadline: Option<Duration>,
        route: Route<'_>,
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
        self.call_until(repeat, end, deadline, route, &message, call)
            .await
    }

    /// [`Client::call`] ending at `end` (`None`: no deadline), `deadline` being what the
    /// caller gave, for the error; `message` stays the caller's (a refused batch is split).
    async fn call_until<M, R, F, Fut>(
        &self,
        repeat: Repeat,
        end: Option<Instant>,
        deadline: Option<Duration>,
        route: Route<'_>,
        message: &M,
        call: F,
    ) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Stubs, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let attempts = match repeat {
            Repeat::Safe => RETRY_ATTEMPTS,
            Repeat::Never => 1,
        };
        let mut pause = RETRY_BACKOFF;
        let mut attempt = 1;
        loop {
            let mut sent_to = None;
            // Routing may have to ask for the cluster's layout first: within the deadline too.
            let sending = async {
                let target = self.target(route).await;
                sent_to = Some(target.address);
                let mut request = tonic::Request::new(message.clone());
                if let Some(end) = end {
                    // grpc-timeout, so that the broker gives up when the caller does.
                    request.set_timeout(end.saturating_duration_since(Instant::now()));
                }
                call(self.stubs(target.channel), request).await
            };
            let answer = match end {
                Some(end) => tokio::time::timeout_at(end, sending).await.ok(),
                None => Some(sending.await),
            };
            let past_deadline = end.is_some_and(|end| Instant::now() >= end);
            let status = match answer {
                Some(Ok(response)) => {
                    if let Some(address) = &sent_to {
                        self.router.reached(address);
                    }
                    return Ok(response.into_inner());
                }
                Some(Err(status)) if lost_connection(&status) => {
                    Status::unavailable(format!("the connection was lost: {status}"))
                }
                Some(Err(status)) => status,
                None => Status::deadline_exceeded("no answer within the deadline"),
            };
            if (past_deadline || unreachable(status.code()))
                && let Some(address) = &sent_to
            {
                // The node may be gone or no longer lead: route the next call afresh.
                self.router.unreachable(address);
            }
            if let (true, Some(deadline)) = (past_deadline, deadline) {
                // Also when tonic's own timer for grpc-timeout ended the call CANCELLED.
                return Err(deadline_exceeded(deadline));
            }
            if status.code() != Code::Unavailable {
                return Err(status);
            }
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
    async fn unary<M, R, F, Fut>(
        &self,
        repeat: Repeat,
        route: Route<'_>,
        message: M,
        call: F,
    ) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Stubs, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        self.call(repeat, Some(self.deadline), route, message, call)
            .await
    }

    // ---- Broker: producers ----

    /// Enqueues one job; see [`job`](crate::job) and the `with_` methods of
    /// [`v1::EnqueueRequest`] to build the request. Goes through the producer middleware
    /// first, then joins the jobs of concurrent calls in one `EnqueueBatch` (see
    /// [`ClientOptions::batching`]; the answer is this job's alone). `INVALID_ARGUMENT` names
    /// a malformed field, `ALREADY_EXISTS` means the dedup key is held by a job with another
    /// payload, `RESOURCE_EXHAUSTED` a full queue or a payload too large. Sent again after
    /// `UNAVAILABLE` only when the job has a dedup key (a repeat then finds the job the first
    /// one made).
    ///
    /// A caller that gives up (drops the future) does not take its job out of a batch: the
    /// job may be created, as with a unary call cancelled in flight.
    pub async fn enqueue(
        &self,
        request: v1::EnqueueRequest,
    ) -> Result<v1::EnqueueResponse, Status> {
        EnqueueNext::start(self.clone(), self.producer.clone())
            .run(request)
            .await
    }

    /// The enqueue itself, past the producer middleware: through the coalescer, or alone.
    pub(crate) async fn send_enqueue(
        &self,
        request: v1::EnqueueRequest,
    ) -> Result<v1::EnqueueResponse, Status> {
        let end = Instant::now().checked_add(self.deadline);
        // Indexes into a batch mean another job in a batch of the coalescer's: such a job goes
        // as its caller sent it.
        if !self.batching || !request.depends_on_index.is_empty() {
            return self.send_alone(request, end, self.deadline).await;
        }
        let key = self.batch_key(&request);
        let joined = self.coalescer.join(self, key, request, end, self.deadline);
        match joined {
            Ok(answer) => match answer.await {
                Ok(Outcome::Done(result)) => result,
                Ok(Outcome::Alone(request)) => self.send_alone(*request, end, self.deadline).await,
                Err(_) => Err(Status::internal(
                    "the batch of this enqueue ended without an answer",
                )),
            },
            // Closed: alone, as without batching.
            Err(request) => self.send_alone(*request, end, self.deadline).await,
        }
    }

    /// The batch `request` joins: its partition once a broker told the count (its queue
    /// before), and whether it has a dedup key.
    fn batch_key(&self, request: &v1::EnqueueRequest) -> Key {
        let place = match self.router.partition_count() {
            Some(count) => Place::Partition(partition_of_queue(&request.queue, count)),
            None => Place::Queue(request.queue.clone()),
        };
        Key {
            place,
            dedup: !request.dedup_key.is_empty(),
        }
    }

    /// One unary `Enqueue` ending at `end`: sent again after `UNAVAILABLE` only with a dedup
    /// key (a repeat then finds the job the first one made).
    async fn send_alone(
        &self,
        request: v1::EnqueueRequest,
        end: Option<Instant>,
        deadline: Duration,
    ) -> Result<v1::EnqueueResponse, Status> {
        let repeat = if request.dedup_key.is_empty() {
            Repeat::Never
        } else {
            Repeat::Safe
        };
        self.call_until(
            repeat,
            end,
            Some(deadline),
            Route::Queue(&request.queue),
            &request,
            |mut s, r| async move { s.broker.enqueue(r).await },
        )
        .await
    }

    /// Enqueues 1 to 1000 jobs, all or nothing; one result per job, in order. Each job goes
    /// through the producer middleware first (a middleware's own answer is not used: the batch
    /// is one call). Sent as it is: never merged with other enqueues, never split. Sent again
    /// after `UNAVAILABLE` only when every job has a dedup key.
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
        // A batch is all or nothing within one partition: it goes to the leader of its first
        // job's queue. One whose jobs span partitions is refused there (INVALID_ARGUMENT).
        let first_queue = prepared.first().map(|j| j.queue.clone());
        let route = first_queue.as_deref().map_or(Route::Any, Route::Queue);
        let request = v1::EnqueueBatchRequest { jobs: prepared };
        let response = self
            .unary(repeat, route, request, |mut s, r| async move {
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
                // Its node may have died or stopped leading the job's partition.
                self.router.mark_stale();
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
                Route::Queue(queue),
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
        let job_id = request.job_id.clone();
        self.unary(
            Repeat::Safe,
            Route::Job(&job_id),
            request,
            |mut s, r| async move { s.broker.heartbeat(r).await },
        )
        .await
    }

    /// Completes a leased job with `result`. `FAILED_PRECONDITION` for a stale lease.
    pub async fn ack(&self, job: &v1::LeasedJob, result: Vec<u8>) -> Result<(), Status> {
        let request = v1::AckRequest {
            job_id: job.job_id.clone(),
            lease_id: job.lease_id.clone(),
            result,
        };
        self.unary(
            Repeat::Safe,
            Route::Job(&job.job_id),
            request,
            |mut s, r| async move { s.broker.ack(r).await },
        )
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
        self.unary(
            Repeat::Safe,
            Route::Job(&job.job_id),
            request,
            |mut s, r| async move { s.broker.fail(r).await },
        )
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
        self.unary(
            Repeat::Safe,
            Route::Job(&job.job_id),
            request,
            |mut s, r| async move { s.broker.release(r).await },
        )
        .await
        .map(|_| ())
    }

    /// Opens a `Work` stream and subscribes. Returns once the broker accepted the subscription;
    /// a refusal (e.g. `INVALID_ARGUMENT` for a bad queue name, `UNAVAILABLE` while a queue's
    /// partition has no leader) ends the stream and is returned as its status.
    /// Pushed jobs and notices arrive on the returned receiver, which ends with
    /// [`WorkEvent::Closed`]. Must be called inside a Tokio runtime (it spawns the reader).
    ///
    /// In a cluster the stream goes to the leader of the subscribed queues when their
    /// partitions share one, otherwise to any node (which relays the others' jobs).
    pub async fn work(
        &self,
        subscribe: v1::SubscribeRequest,
    ) -> Result<(WorkStream, mpsc::UnboundedReceiver<WorkEvent>), Status> {
        let target = self
            .router
            .stream_target(&subscribe.queues, &self.tag)
            .await;
        self.work_on(target, subscribe).await
    }

    /// The `Work` streams a worker over `queues` holds now (the table fetched again if stale).
    pub(crate) async fn stream_groups(
        &self,
        queues: &[String],
        max_in_flight: i32,
    ) -> Vec<StreamGroup> {
        self.router
            .stream_groups(queues, max_in_flight, &self.tag)
            .await
    }

    /// True when the latest table is a cluster's.
    pub(crate) fn routes_cluster(&self) -> bool {
        self.router.is_cluster()
    }

    /// The next routed call asks for the table first (leaders may have changed).
    pub(crate) fn routes_changed(&self) {
        self.router.mark_stale();
    }

    /// Opens the `Work` stream of one group (see [`Client::stream_groups`]): on the node at
    /// `address`, or for `None` on any node; otherwise as [`Client::work`].
    pub(crate) async fn work_at(
        &self,
        address: Option<&str>,
        subscribe: v1::SubscribeRequest,
    ) -> Result<(WorkStream, mpsc::UnboundedReceiver<WorkEvent>), Status> {
        let target = self.router.group_target(address);
        self.work_on(target, subscribe).await
    }

    /// Opens a `Work` stream on `target`, first telling the observer where it goes; a stream
    /// that cannot open tells the router that node failed it (the table is fetched again).
    async fn work_on(
        &self,
        target: Target,
        subscribe: v1::SubscribeRequest,
    ) -> Result<(WorkStream, mpsc::UnboundedReceiver<WorkEvent>), Status> {
        if let Some(observer) = &self.observer {
            observer(&target.address);
        }
        let address = target.address.clone();
        let opened = self.open_work(target, subscribe).await;
        if let Err(status) = &opened {
            self.stream_ended(&address, Some(status));
        }
        opened
    }

    async fn open_work(
        &self,
        target: Target,
        subscribe: v1::SubscribeRequest,
    ) -> Result<(WorkStream, mpsc::UnboundedReceiver<WorkEvent>), Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = WorkStream {
            shared: Arc::new(Shared::new(tx, target.address)),
        };
        let subscribed = stream.start(Request::Subscribe(subscribe))?;
        let responses = self
            .stubs(target.channel)
            .broker
            .work(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await?
            .into_inner();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_responses(responses, stream.shared.clone(), events_tx));
        *stream.shared.reader.lock().unwrap() = Some(reader.abort_handle());
        // A caller that gives up before the answer (a worker ending a stream still opening)
        // drops this future: the reader must not keep the call open then.
        let cancel_unless_subscribed = CancelOnDrop::new(&stream);
        // Refused while the stream stays open (UNAVAILABLE: a queue's partition has no leader
        // yet; or a code retrying would not change): it will never push, so it ends here, as the
        // guard drops. The caller takes it as a stream that ended with this code.
        stream.finish(subscribed).await?;
        cancel_unless_subscribed.disarm();
        Ok((stream, events_rx))
    }

    /// A `Work` stream of this client ended (`end`: with this status): the next one is routed
    /// afresh, as its node may have died or stopped leading the queues.
    pub(crate) fn work_stream_ended(&self, stream: &WorkStream, end: Option<&Status>) {
        self.stream_ended(&stream.shared.node, end);
    }

    fn stream_ended(&self, address: &str, end: Option<&Status>) {
        match end {
            Some(status) if unreachable(status.code()) || lost_connection(status) => {
                self.router.unreachable(address)
            }
            _ => self.router.mark_stale(),
        }
    }

    // ---- Admin: jobs ----

    /// The job as it is now (state, attempts, result, checkpoint, progress, ...). `NOT_FOUND`
    /// for an unknown id.
    pub async fn get_job(&self, job_id: &str) -> Result<v1::Job, Status> {
        let request = v1::GetJobRequest {
            job_id: job_id.into(),
        };
        self.unary(
            Repeat::Safe,
            Route::Job(job_id),
            request,
            |mut s, r| async move { s.admin.get_job(r).await },
        )
        .await
    }

    /// The job as it is now, then one message per change, ending after the one that shows a
    /// terminal state. No deadline; opening it is retried like a read. A stream the broker
    /// ends with `UNAVAILABLE` (it shut down) can be watched again.
    pub async fn watch_job(&self, job_id: &str) -> Result<tonic::Streaming<v1::Job>, Status> {
        let request = v1::WatchJobRequest {
            job_id: job_id.into(),
        };
        self.call(
            Repeat::Safe,
            None,
            Route::Job(job_id),
            request,
            |mut s, r| async move { s.admin.watch_job(r).await },
        )
        .await
    }

    /// One page of the jobs of a queue (in one state, or all), oldest first unless
    /// `newest_first`; `next_page_token` is empty on the last page.
    pub async fn list_jobs(
        &self,
        request: v1::ListJobsRequest,
    ) -> Result<v1::ListJobsResponse, Status> {
        let queue = request.queue.clone();
        self.unary(
            Repeat::Safe,
            Route::Queue(&queue),
            request,
            |mut s, r| async move { s.admin.list_jobs(r).await },
        )
        .await
    }

    /// Cancels a job: READY or SCHEDULED ones at once, an ACTIVE one through its worker
    /// (`cancel_requested`). `FAILED_PRECONDITION` if it has already ended.
    pub async fn cancel_job(&self, job_id: &str) -> Result<v1::Job, Status> {
        let request = v1::CancelJobRequest {
            job_id: job_id.into(),
        };
        self.unary(
            Repeat::Never,
            Route::Job(job_id),
            request,
            |mut s, r| async move { s.admin.cancel_job(r).await },
        )
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
        let (queue, job_id) = (request.queue.clone(), request.job_id.clone());
        // A bulk redrive goes to its queue's leader, one job to its own.
        let route = if queue.is_empty() {
            Route::Job(&job_id)
        } else {
            Route::Queue(&queue)
        };
        self.unary(Repeat::Never, route, request, |mut s, r| async move {
            s.admin.retry_job(r).await
        })
        .await
    }

    /// Removes a job that is not ACTIVE (`FAILED_PRECONDITION`: cancel it first).
    pub async fn delete_job(&self, job_id: &str) -> Result<(), Status> {
        let request = v1::DeleteJobRequest {
            job_id: job_id.into(),
        };
        self.unary(
            Repeat::Never,
            Route::Job(job_id),
            request,
            |mut s, r| async move { s.admin.delete_job(r).await },
        )
        .await
        .map(|_| ())
    }

    // ---- Admin: queues ----

    /// Every queue (that the token may see), by name.
    pub async fn list_queues(&self) -> Result<Vec<v1::QueueInfo>, Status> {
        let response = self
            .unary(
                Repeat::Safe,
                Route::Any,
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
        self.unary(
            Repeat::Safe,
            Route::Queue(queue),
            request,
            |mut s, r| async move { s.admin.get_queue(r).await },
        )
        .await
    }

    /// Changes a queue's policy at run time (the fields set in `policy`; with `reset`, the
    /// run-time overrides are dropped first). Creates the queue if it is new.
    pub async fn update_queue_policy(
        &self,
        request: v1::UpdateQueuePolicyRequest,
    ) -> Result<v1::QueueInfo, Status> {
        let queue = request.queue.clone();
        self.unary(
            Repeat::Safe,
            Route::Queue(&queue),
            request,
            |mut s, r| async move { s.admin.update_queue_policy(r).await },
        )
        .await
    }

    /// Stops leasing from the queue (enqueues are still taken).
    pub async fn pause_queue(&self, queue: &str) -> Result<v1::QueueInfo, Status> {
        let request = v1::PauseQueueRequest {
            queue: queue.into(),
        };
        self.unary(
            Repeat::Safe,
            Route::Queue(queue),
            request,
            |mut s, r| async move { s.admin.pause_queue(r).await },
        )
        .await
    }

    /// Leases from the queue again.
    pub async fn resume_queue(&self, queue: &str) -> Result<v1::QueueInfo, Status> {
        let request = v1::ResumeQueueRequest {
            queue: queue.into(),
        };
        self.unary(
            Repeat::Safe,
            Route::Queue(queue),
            request,
            |mut s, r| async move { s.admin.resume_queue(r).await },
        )
        .await
    }

    /// Removes the queue's jobs in `states` (none given: every terminal state); how many.
    pub async fn purge_queue(&self, queue: &str, states: &[v1::JobState]) -> Result<i64, Status> {
        let request = v1::PurgeQueueRequest {
            queue: queue.into(),
            states: states.iter().map(|s| *s as i32).collect(),
        };
        let response = self
            .unary(
                Repeat::Never,
                Route::Queue(queue),
                request,
                |mut s, r| async move { s.admin.purge_queue(r).await },
            )
            .await?;
        Ok(response.purged)
    }

    // ---- Admin: cluster and workers ----

    /// The nodes and each partition's leader (a single node answers as a cluster of one).
    pub async fn get_cluster(&self) -> Result<v1::ClusterInfo, Status> {
        self.unary(
            Repeat::Safe,
            Route::Any,
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
            .unary(Repeat::Safe, Route::Any, request, |mut s, r| async move {
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
        let queue = request
            .schedule
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .map(|t| t.queue.clone());
        // A schedule lives in the partition of its template's queue.
        let route = queue.as_deref().map_or(Route::Any, Route::Queue);
        self.unary(Repeat::Safe, route, request, |mut s, r| async move {
            s.admin.put_schedule(r).await
        })
        .await
    }

    /// One schedule; `NOT_FOUND` for an unknown id.
    pub async fn get_schedule(&self, schedule_id: &str) -> Result<v1::Schedule, Status> {
        let request = v1::GetScheduleRequest {
            schedule_id: schedule_id.into(),
        };
        self.unary(Repeat::Safe, Route::Any, request, |mut s, r| async move {
            s.admin.get_schedule(r).await
        })
        .await
    }

    /// Every schedule (whose template enqueues into `queue`, if given), by id.
    pub async fn list_schedules(&self, queue: Option<&str>) -> Result<Vec<v1::Schedule>, Status> {
        let request = v1::ListSchedulesRequest {
            queue: queue.unwrap_or_default().into(),
        };
        let route = queue
            .filter(|q| !q.is_empty())
            .map_or(Route::Any, Route::Queue);
        let response = self
            .unary(Repeat::Safe, route, request, |mut s, r| async move {
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
        self.unary(Repeat::Never, Route::Any, request, |mut s, r| async move {
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
        self.unary(Repeat::Never, Route::Any, request, |mut s, r| async move {
            s.admin.trigger_schedule(r).await
        })
        .await
    }
}

impl SendBatch for Client {
    /// A batch of one as unary `Enqueue`, of more as `EnqueueBatch` to the leader of their
    /// partition, within the earliest of the callers' deadlines; answers every caller.
    async fn send(&self, batch: Batch) {
        let (end, deadline) = batch.deadline();
        let repeat = if batch.deduplicated() {
            Repeat::Safe
        } else {
            Repeat::Never
        };
        let Batch {
            mut jobs,
            mut callers,
            ..
        } = batch;
        if jobs.len() == 1
            && let (Some(job), Some(caller)) = (jobs.pop(), callers.pop())
        {
            let result = self.send_alone(job, caller.end, caller.deadline).await;
            caller.answer(Outcome::Done(result));
            return;
        }
        let queue = jobs.first().map(|j| j.queue.clone()).unwrap_or_default();
        let request = v1::EnqueueBatchRequest { jobs };
        let result = self
            .call_until(
                repeat,
                end,
                Some(deadline),
                Route::Queue(&queue),
                &request,
                |mut s, r| async move { s.broker.enqueue_batch(r).await },
            )
            .await
            .map(|response| response.results);
        crate::coalescer::answer(callers, request.jobs, result);
    }
}
