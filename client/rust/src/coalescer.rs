//! Producer coalescing (`docs/worker-contract.md` §10): concurrent
//! [`Client::enqueue`](crate::Client::enqueue) calls are merged into `EnqueueBatch` calls, and
//! each caller still gets its own answer.
//!
//! Tokio is taken as the threaded case of the contract: a job that finds fewer than
//! `max_in_flight` batches of its key in flight is sent at once (with no linger); otherwise it
//! waits in the open batch, which the task of the batch that ends next sends. Each batch runs
//! on a task of its own rather than on its first caller's: a caller that gives up (drops its
//! future) must not take the other callers' jobs down with it.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::middleware::BoxFuture;
use crate::options::BatchOptions;
use crate::{Code, Status, v1};

/// Where the jobs of a batch go: a batch never spans partitions (the broker refuses that).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Place {
    /// The partition of the job's queue, once a broker told the partition count.
    Partition(u32),
    /// Before that: the queue itself, which is in one partition whatever the count.
    Queue(String),
}

/// The jobs that may share a batch. Jobs with a dedup key are kept apart from those without,
/// so that a batch is sent again after `UNAVAILABLE` exactly when each of its jobs would have
/// been alone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub place: Place,
    pub dedup: bool,
}

/// What a caller of [`Coalescer::join`] is told.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The answer of its job.
    Done(Result<v1::EnqueueResponse, Status>),
    /// The batch was refused whole and applied nothing: the caller sends its job again alone,
    /// so that only a bad job fails, with the message a unary call gives.
    Alone(Box<v1::EnqueueRequest>),
}

/// One caller waiting for the answer of its job.
#[derive(Debug)]
pub(crate) struct Caller {
    /// When its deadline ends (`None`: it has none).
    pub end: Option<Instant>,
    /// Its deadline, for the error message.
    pub deadline: Duration,
    answer: oneshot::Sender<Outcome>,
}

impl Caller {
    /// Tells the caller; one that gave up is not there to hear it, which is fine.
    pub fn answer(self, outcome: Outcome) {
        let _ = self.answer.send(outcome);
    }
}

/// Jobs of one key, in the order of their calls, and their callers (the i-th answers the i-th).
#[derive(Debug)]
pub(crate) struct Batch {
    key: Key,
    id: u64,
    pub jobs: Vec<v1::EnqueueRequest>,
    pub callers: Vec<Caller>,
    /// Payload and header bytes of `jobs`.
    bytes: usize,
    /// Full: no job joins it any more, and it goes as soon as the in-flight limit allows.
    sealed: bool,
    /// Its linger is over (or it never had one): it goes as soon as the limit allows.
    due: bool,
}

impl Batch {
    /// The earliest end of its callers' deadlines, and that deadline; `None` when no caller
    /// has one.
    pub fn deadline(&self) -> (Option<Instant>, Duration) {
        let earliest = self
            .callers
            .iter()
            .filter_map(|c| c.end.map(|end| (end, c.deadline)))
            .min_by_key(|(end, _)| *end);
        match earliest {
            Some((end, deadline)) => (Some(end), deadline),
            None => (None, Duration::MAX),
        }
    }

    /// True when its jobs have dedup keys (a repeat after `UNAVAILABLE` is then safe).
    pub fn deduplicated(&self) -> bool {
        self.key.dedup
    }
}

/// The codes with which the broker refuses an `EnqueueBatch` whole, having applied nothing:
/// sending each job alone is then safe, and tells which job was at fault.
fn refuses_whole(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::ResourceExhausted
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::NotFound
            | Code::OutOfRange
            | Code::PermissionDenied
    )
}

/// Answers the callers of a batch of two or more jobs from the `EnqueueBatch` call's result:
/// the i-th result to the i-th caller; after a refusal that applied nothing, each its own job
/// back to send alone; after any other failure, each the error.
pub(crate) fn answer(
    callers: Vec<Caller>,
    jobs: Vec<v1::EnqueueRequest>,
    result: Result<Vec<v1::EnqueueResponse>, Status>,
) {
    match result {
        Ok(results) if results.len() == callers.len() => {
            for (caller, result) in callers.into_iter().zip(results) {
                caller.answer(Outcome::Done(Ok(result)));
            }
        }
        Ok(results) => {
            let status = Status::internal(format!(
                "EnqueueBatch answered {} results for {} jobs",
                results.len(),
                callers.len()
            ));
            for caller in callers {
                caller.answer(Outcome::Done(Err(status.clone())));
            }
        }
        Err(status) if refuses_whole(status.code()) => {
            for (caller, job) in callers.into_iter().zip(jobs) {
                caller.answer(Outcome::Alone(Box::new(job)));
            }
        }
        Err(status) => {
            for caller in callers {
                caller.answer(Outcome::Done(Err(status.clone())));
            }
        }
    }
}

/// Sends a batch and answers each of its callers; [`Client`](crate::Client) does, and the
/// unit tests put a stub in its place.
pub(crate) trait SendBatch: Clone + Send + Sync + 'static {
    fn send(&self, batch: Batch) -> impl Future<Output = ()> + Send;
}

/// The payload and header bytes of `job`, what `batch_max_bytes` counts.
fn job_bytes(job: &v1::EnqueueRequest) -> usize {
    job.payload.len()
        + job
            .headers
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum::<usize>()
}

/// The open and waiting batches of all keys, shared by the clones of a client (those with the
/// same token: a batch goes out with one).
#[derive(Debug)]
pub(crate) struct Coalescer {
    options: BatchOptions,
    state: Mutex<State>,
    /// Woken when the last batch ends, for [`Coalescer::close`].
    idle: Notify,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<Key, KeyState>,
    next_id: u64,
    /// Batches opened and not ended yet, of all keys.
    outstanding: usize,
    closed: bool,
}

#[derive(Debug, Default)]
struct KeyState {
    in_flight: usize,
    /// Not sent yet, oldest first; only the last may be open (not sealed).
    waiting: VecDeque<Batch>,
}

impl KeyState {
    /// Takes the batches that go now: the oldest first, while the in-flight limit allows and
    /// each is full or due.
    fn take_ready(&mut self, max_in_flight: usize) -> Vec<Batch> {
        let mut ready = Vec::new();
        while self.in_flight < max_in_flight
            && self.waiting.front().is_some_and(|b| b.sealed || b.due)
        {
            ready.extend(self.waiting.pop_front());
            self.in_flight += 1;
        }
        ready
    }
}

impl Coalescer {
    pub fn new(options: BatchOptions) -> Self {
        Self {
            options,
            state: Mutex::new(State::default()),
            idle: Notify::new(),
        }
    }

    pub fn options(&self) -> &BatchOptions {
        &self.options
    }

    /// Adds `job` to the open batch of `key` (opening one if there is none, or if the job
    /// would take it past `max_bytes`), and sends what may go now on tasks of their own. The
    /// receiver gets the job's [`Outcome`]. `Err` gives the job back once the coalescer is
    /// closed: the caller sends it alone.
    pub fn join<S: SendBatch>(
        self: &Arc<Self>,
        sender: &S,
        key: Key,
        job: v1::EnqueueRequest,
        end: Option<Instant>,
        deadline: Duration,
    ) -> Result<oneshot::Receiver<Outcome>, Box<v1::EnqueueRequest>> {
        let options = &self.options;
        let bytes = job_bytes(&job);
        let (tx, rx) = oneshot::channel();
        let caller = Caller {
            end,
            deadline,
            answer: tx,
        };
        let mut linger_timer = None;
        let ready = {
            let mut guard = self.state.lock().unwrap();
            let state = &mut *guard;
            if state.closed {
                return Err(Box::new(job));
            }
            if !state.keys.contains_key(&key) {
                state.keys.insert(key.clone(), KeyState::default());
            }
            let keyed = state.keys.get_mut(&key).expect("inserted above");
            let joins = match keyed.waiting.back_mut() {
                Some(open) if !open.sealed => {
                    // Past max_bytes with this job: it starts the next batch instead, so that
                    // a batch stays within the limit unless one job alone exceeds it.
                    let fits = open.bytes + bytes <= options.max_bytes;
                    open.sealed = !fits;
                    fits
                }
                _ => false,
            };
            if !joins {
                let id = state.next_id;
                state.next_id += 1;
                state.outstanding += 1;
                let due = options.linger.is_zero();
                // A batch opened at the limit needs no timer: it goes when a batch in flight
                // ends (rule 4).
                if !due && keyed.in_flight < options.max_in_flight {
                    linger_timer = Some(id);
                }
                keyed.waiting.push_back(Batch {
                    key: key.clone(),
                    id,
                    jobs: Vec::new(),
                    callers: Vec::new(),
                    bytes: 0,
                    sealed: false,
                    due,
                });
            }
            let open = keyed.waiting.back_mut().expect("an open batch");
            open.jobs.push(job);
            open.callers.push(caller);
            open.bytes += bytes;
            if open.jobs.len() >= options.max_jobs || open.bytes >= options.max_bytes {
                open.sealed = true;
            }
            keyed.take_ready(options.max_in_flight)
        };
        for batch in ready {
            tokio::spawn(self.clone().drive(sender.clone(), batch));
        }
        if let Some(id) = linger_timer {
            let (coalescer, sender, linger) = (self.clone(), sender.clone(), options.linger);
            tokio::spawn(async move {
                tokio::time::sleep(linger).await;
                let ready = coalescer.linger_over(&key, id);
                coalescer.send_all(&sender, ready).await;
            });
        }
        Ok(rx)
    }

    /// Sends `ready`: the first on this task, the others on tasks of their own.
    async fn send_all<S: SendBatch>(self: &Arc<Self>, sender: &S, ready: Vec<Batch>) {
        let mut ready = ready.into_iter();
        let Some(first) = ready.next() else {
            return;
        };
        for batch in ready {
            tokio::spawn(self.clone().drive(sender.clone(), batch));
        }
        self.clone().drive(sender.clone(), first).await;
    }

    /// Sends `batch`, then, as long as its end lets another batch of its key go, that one.
    /// Boxed: it spawns itself, so its future's type must be known to be `Send`.
    fn drive<S: SendBatch>(self: Arc<Self>, sender: S, batch: Batch) -> BoxFuture<()> {
        Box::pin(async move {
            let mut batch = batch;
            loop {
                let key = batch.key.clone();
                sender.send(batch).await;
                let mut ready = self.ended(&key).into_iter();
                let Some(next) = ready.next() else {
                    return;
                };
                for other in ready {
                    tokio::spawn(self.clone().drive(sender.clone(), other));
                }
                batch = next;
            }
        })
    }

    /// A batch of `key` ended: the batches that go now.
    fn ended(&self, key: &Key) -> Vec<Batch> {
        let max_in_flight = self.options.max_in_flight;
        let mut state = self.state.lock().unwrap();
        let keyed = state
            .keys
            .get_mut(key)
            .expect("a batch in flight has its key");
        if keyed.in_flight >= max_in_flight
            && let Some(waiting) = keyed.waiting.front_mut()
        {
            // It waited for the limit only: it goes at once, its linger or not (rule 4).
            waiting.due = true;
        }
        keyed.in_flight -= 1;
        let ready = keyed.take_ready(max_in_flight);
        if keyed.in_flight == 0 && keyed.waiting.is_empty() {
            // Keys by queue name come and go: keep only those with batches.
            state.keys.remove(key);
        }
        state.outstanding -= 1;
        if state.outstanding == 0 {
            self.idle.notify_waiters();
        }
        ready
    }

    /// The linger of batch `id` of `key` is over: the batches that go now.
    fn linger_over(&self, key: &Key, id: u64) -> Vec<Batch> {
        let mut state = self.state.lock().unwrap();
        let Some(keyed) = state.keys.get_mut(key) else {
            return Vec::new(); // sent already
        };
        if let Some(batch) = keyed.waiting.iter_mut().find(|b| b.id == id) {
            batch.due = true;
        }
        keyed.take_ready(self.options.max_in_flight)
    }

    /// Sends the open batches (within the in-flight limit, as ever) and waits until every
    /// batch has ended. Later jobs are given back by [`Coalescer::join`] to be sent alone.
    pub async fn close<S: SendBatch>(self: &Arc<Self>, sender: &S) {
        let ready: Vec<Batch> = {
            let mut state = self.state.lock().unwrap();
            state.closed = true;
            let max_in_flight = self.options.max_in_flight;
            state
                .keys
                .values_mut()
                .flat_map(|keyed| {
                    for batch in &mut keyed.waiting {
                        batch.due = true;
                    }
                    keyed.take_ready(max_in_flight)
                })
                .collect()
        };
        for batch in ready {
            tokio::spawn(self.clone().drive(sender.clone(), batch));
        }
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so that a batch ending in between still wakes it.
            notified.as_mut().enable();
            if self.state.lock().unwrap().outstanding == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job;
    use tokio::sync::Semaphore;

    /// Stands for the broker: records each batch's payloads as it starts, holds it until
    /// [`Stub::release`] lets one end, then answers every job OK with its payload as id.
    #[derive(Clone)]
    struct Stub {
        inner: Arc<StubState>,
    }

    impl Default for Stub {
        fn default() -> Self {
            Self {
                inner: Arc::new(StubState {
                    sent: Mutex::default(),
                    in_flight: Mutex::default(),
                    gate: Semaphore::new(0),
                }),
            }
        }
    }

    struct StubState {
        sent: Mutex<Vec<Vec<String>>>,
        in_flight: Mutex<(usize, usize)>, // (now, most ever)
        gate: Semaphore,
    }

    impl Stub {
        fn open() -> Self {
            let stub = Self::default();
            stub.release(Semaphore::MAX_PERMITS);
            stub
        }

        fn release(&self, batches: usize) {
            self.inner.gate.add_permits(batches);
        }

        fn sent(&self) -> Vec<Vec<String>> {
            self.inner.sent.lock().unwrap().clone()
        }

        fn most_in_flight(&self) -> usize {
            self.inner.in_flight.lock().unwrap().1
        }
    }

    impl SendBatch for Stub {
        async fn send(&self, batch: Batch) {
            let payloads: Vec<String> = batch
                .jobs
                .iter()
                .map(|j| String::from_utf8(j.payload.clone()).unwrap())
                .collect();
            self.inner.sent.lock().unwrap().push(payloads.clone());
            {
                let mut in_flight = self.inner.in_flight.lock().unwrap();
                in_flight.0 += 1;
                in_flight.1 = in_flight.1.max(in_flight.0);
            }
            self.inner.gate.acquire().await.unwrap().forget();
            self.inner.in_flight.lock().unwrap().0 -= 1;
            let results = payloads
                .into_iter()
                .map(|p| v1::EnqueueResponse {
                    job_id: p,
                    ..Default::default()
                })
                .collect();
            answer(batch.callers, batch.jobs, Ok(results));
        }
    }

    fn options(max_jobs: usize, max_bytes: usize, max_in_flight: usize) -> BatchOptions {
        BatchOptions {
            enabled: true,
            max_jobs,
            max_bytes,
            linger: Duration::ZERO,
            max_in_flight,
        }
    }

    fn key(queue: &str) -> Key {
        Key {
            place: Place::Queue(queue.into()),
            dedup: false,
        }
    }

    /// Lets the spawned batch tasks run as far as they can (a current-thread runtime runs
    /// them only while the test waits).
    async fn settle() {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    fn join(coalescer: &Arc<Coalescer>, stub: &Stub, payload: &str) -> oneshot::Receiver<Outcome> {
        coalescer
            .join(stub, key("q"), job("q", payload), None, Duration::MAX)
            .unwrap()
    }

    async fn id_of(answer: oneshot::Receiver<Outcome>) -> String {
        match answer.await.unwrap() {
            Outcome::Done(Ok(response)) => response.job_id,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn batches_hold_at_most_max_jobs_in_call_order_within_the_in_flight_limit() {
        let coalescer = Arc::new(Coalescer::new(options(10, 1 << 20, 2)));
        let stub = Stub::default(); // holds every batch until released
        let names: Vec<String> = (0..35).map(|i| format!("j{i:02}")).collect();
        let answers: Vec<_> = names.iter().map(|n| join(&coalescer, &stub, n)).collect();
        settle().await;
        // The first two found room in flight and went alone; the rest wait, in full batches
        // and one open.
        assert_eq!(stub.sent(), [vec!["j00"], vec!["j01"]]);
        for step in 0..5 {
            stub.release(1);
            settle().await;
            assert!(stub.most_in_flight() <= 2, "step {step}: {:?}", stub.sent());
        }
        stub.release(Semaphore::MAX_PERMITS >> 1);
        for (answer, name) in answers.into_iter().zip(&names) {
            assert_eq!(&id_of(answer).await, name);
        }
        let sent = stub.sent();
        assert!(sent.iter().all(|b| b.len() <= 10), "{sent:?}");
        let sizes: Vec<usize> = sent.iter().map(Vec::len).collect();
        assert_eq!(sizes, [1, 1, 10, 10, 10, 3]);
        assert_eq!(sent.concat(), names, "in the order of the calls");
        assert_eq!(stub.most_in_flight(), 2);
    }

    #[tokio::test]
    async fn a_job_that_would_pass_max_bytes_starts_the_next_batch() {
        // 40-byte payloads, 100 bytes a batch: two fit, a third starts the next batch.
        let coalescer = Arc::new(Coalescer::new(options(100, 100, 1)));
        let stub = Stub::default();
        let payload = |i: usize| format!("{i:040}");
        let mut answers: Vec<_> = (0..6)
            .map(|i| join(&coalescer, &stub, &payload(i)))
            .collect();
        // One job alone above the limit still goes, alone.
        let big = "x".repeat(150);
        answers.push(join(&coalescer, &stub, &big));
        stub.release(Semaphore::MAX_PERMITS >> 1);
        for answer in answers {
            id_of(answer).await;
        }
        let sizes: Vec<usize> = stub.sent().iter().map(Vec::len).collect();
        // j0 alone (nothing in flight), then 2 + 2 + 1 by bytes, then the big one.
        assert_eq!(sizes, [1, 2, 2, 1, 1]);
        // Counting header names and values too: 40 + 30 + 30 > 100.
        let coalescer = Arc::new(Coalescer::new(options(100, 100, 1)));
        let stub = Stub::default();
        let with_header = |p: &str| job("q", p).with_header("h".repeat(10), "v".repeat(20));
        let answers: Vec<_> = ["first", &payload(1), &payload(2), &payload(3)]
            .iter()
            .map(|p| {
                coalescer
                    .join(&stub, key("q"), with_header(p), None, Duration::MAX)
                    .unwrap()
            })
            .collect();
        stub.release(Semaphore::MAX_PERMITS >> 1);
        for answer in answers {
            id_of(answer).await;
        }
        let sizes: Vec<usize> = stub.sent().iter().map(Vec::len).collect();
        assert_eq!(sizes, [1, 1, 1, 1], "70 bytes each: no two fit in 100");
    }

    #[tokio::test]
    async fn keys_batch_apart_and_each_has_its_own_in_flight_limit() {
        let coalescer = Arc::new(Coalescer::new(options(100, 1 << 20, 1)));
        let stub = Stub::default();
        let keyed = Key {
            place: Place::Queue("q".into()),
            dedup: true,
        };
        let mut answers = Vec::new();
        for i in 0..3 {
            answers.push(join(&coalescer, &stub, &format!("plain{i}")));
            let job = job("q", format!("keyed{i}")).with_dedup_key(format!("k{i}"));
            answers.push(
                coalescer
                    .join(&stub, keyed.clone(), job, None, Duration::MAX)
                    .unwrap(),
            );
        }
        settle().await;
        // One of each key in flight at once.
        assert_eq!(stub.sent(), [vec!["plain0"], vec!["keyed0"]]);
        stub.release(Semaphore::MAX_PERMITS >> 1);
        for answer in answers {
            id_of(answer).await;
        }
        let mut sent = stub.sent();
        sent.sort();
        assert_eq!(
            sent,
            [
                vec!["keyed0"],
                vec!["keyed1", "keyed2"],
                vec!["plain0"],
                vec!["plain1", "plain2"]
            ]
        );
    }

    #[tokio::test]
    async fn close_sends_the_open_batches_and_waits_for_those_in_flight() {
        let coalescer = Arc::new(Coalescer::new(BatchOptions {
            linger: Duration::from_secs(3600),
            ..options(100, 1 << 20, 4)
        }));
        let stub = Stub::open();
        let answers: Vec<_> = (0..5)
            .map(|i| join(&coalescer, &stub, &format!("j{i}")))
            .collect();
        settle().await;
        assert!(stub.sent().is_empty(), "lingering: {:?}", stub.sent());
        coalescer.close(&stub).await;
        assert_eq!(stub.sent(), [vec!["j0", "j1", "j2", "j3", "j4"]]);
        for answer in answers {
            // Answered before close returned.
            assert!(matches!(answer.await.unwrap(), Outcome::Done(Ok(_))));
        }
        // Once closed, a job is given back to be sent alone.
        assert!(
            coalescer
                .join(&stub, key("q"), job("q", "late"), None, Duration::MAX)
                .is_err()
        );
    }

    #[tokio::test]
    async fn close_waits_for_a_batch_held_in_flight() {
        let coalescer = Arc::new(Coalescer::new(options(100, 1 << 20, 1)));
        let stub = Stub::default();
        let first = join(&coalescer, &stub, "a");
        let second = join(&coalescer, &stub, "b");
        settle().await;
        let closing = tokio::spawn({
            let coalescer = coalescer.clone();
            let stub = stub.clone();
            async move { coalescer.close(&stub).await }
        });
        settle().await;
        assert!(!closing.is_finished(), "two batches still to end");
        stub.release(1);
        settle().await;
        assert!(!closing.is_finished(), "the second batch is in flight");
        stub.release(1);
        closing.await.unwrap();
        assert_eq!(id_of(first).await, "a");
        assert_eq!(id_of(second).await, "b");
    }

    #[tokio::test]
    async fn a_refusal_gives_each_job_back_and_other_errors_reach_every_caller() {
        let callers_of = |n: usize| {
            let (callers, answers): (Vec<_>, Vec<_>) = (0..n)
                .map(|_| {
                    let (tx, rx) = oneshot::channel();
                    let caller = Caller {
                        end: None,
                        deadline: Duration::MAX,
                        answer: tx,
                    };
                    (caller, rx)
                })
                .unzip();
            (callers, answers)
        };
        let jobs = || vec![job("q", "a"), job("q", "b")];
        for code in [
            Code::InvalidArgument,
            Code::ResourceExhausted,
            Code::NotFound,
        ] {
            let (callers, answers) = callers_of(2);
            answer(
                callers,
                jobs(),
                Err(Status::new(code, "jobs[1].headers: bad")),
            );
            for (answer, want) in answers.into_iter().zip(["a", "b"]) {
                match answer.await.unwrap() {
                    Outcome::Alone(job) => assert_eq!(job.payload, want.as_bytes()),
                    other => panic!("{code:?}: {other:?}"),
                }
            }
        }
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Internal] {
            let (callers, answers) = callers_of(2);
            answer(callers, jobs(), Err(Status::new(code, "down")));
            for answer in answers {
                match answer.await.unwrap() {
                    Outcome::Done(Err(status)) => assert_eq!(status.code(), code),
                    other => panic!("{code:?}: {other:?}"),
                }
            }
        }
        let (callers, answers) = callers_of(2);
        answer(callers, jobs(), Ok(vec![v1::EnqueueResponse::default()]));
        for answer in answers {
            match answer.await.unwrap() {
                Outcome::Done(Err(status)) => assert_eq!(status.code(), Code::Internal),
                other => panic!("{other:?}"),
            }
        }
    }
}
