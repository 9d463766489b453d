//! A complete jobbroker worker on the `Work` stream.
//!
//!     cargo run --example worker -- --address 127.0.0.1:7070 --queue emails [--concurrency 4]
//!         [--worker-id NAME] [--grace-secs 30]
//!
//! It receives pushed jobs, runs up to `--concurrency` at once, heartbeats each running job
//! every third of its lease, acks on success and fails on error (the broker retries with the
//! queue's backoff; `permanent` errors are not retried). A job whose lease is lost is abandoned
//! without an answer; a job an operator cancels is stopped and failed. It reconnects with backoff
//! (100 ms doubling to 5 s) when the stream breaks, and stops on SIGTERM/SIGINT: Flow{0} so no
//! new jobs come, release jobs that were pushed but not started, let running jobs finish
//! (at most --grace-secs), wait for their acks, close the stream, exit 0.
//!
//! The demo handler reads the payload as text: `sleep:MS` works MS milliseconds, `fail` always
//! fails (retried), `flaky` fails on its first attempt only, `poison` fails permanently;
//! anything else succeeds at once with the upper-cased payload as the result.

use std::collections::HashMap;
use std::time::Duration;

use jobbroker::v1::{LeasedJob, SubscribeRequest};
use jobbroker::{Client, Code, Status, WorkEvent, WorkStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// Why a handler did not succeed.
struct JobError {
    message: String,
    permanent: bool,
    /// Set when the job was stopped from outside rather than failing by itself.
    interrupted: Option<Stop>,
}

impl JobError {
    fn retry(message: &str) -> Self {
        Self {
            message: message.into(),
            permanent: false,
            interrupted: None,
        }
    }
    fn permanent(message: &str) -> Self {
        Self {
            message: message.into(),
            permanent: true,
            interrupted: None,
        }
    }
    fn interrupted(why: Stop) -> Self {
        Self {
            message: format!("interrupted: {why:?}"),
            permanent: false,
            interrupted: Some(why),
        }
    }
}

/// The work itself. Replace with your own.
async fn handle(job: &LeasedJob) -> Result<Vec<u8>, JobError> {
    let text = String::from_utf8_lossy(&job.payload).into_owned();
    if let Some(ms) = text.strip_prefix("sleep:") {
        let ms: u64 = ms
            .trim()
            .parse()
            .map_err(|_| JobError::permanent("bad sleep payload"))?;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return Ok(format!("slept {ms} ms").into_bytes());
    }
    match text.as_str() {
        "fail" => Err(JobError::retry("demo failure")),
        "flaky" if job.attempt == 1 => Err(JobError::retry("flaky: first attempt fails")),
        "poison" => Err(JobError::permanent("poison payload")),
        _ => Ok(text.to_uppercase().into_bytes()),
    }
}

struct Options {
    address: String,
    queue: String,
    worker_id: String,
    concurrency: usize,
    grace: Duration,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        address: "127.0.0.1:7070".into(),
        queue: String::new(),
        worker_id: format!("rust-example-{}", std::process::id()),
        concurrency: 4,
        grace: Duration::from_secs(30),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--address" => options.address = value()?,
            "--queue" => options.queue = value()?,
            "--worker-id" => options.worker_id = value()?,
            "--concurrency" => {
                options.concurrency = value()?.parse().map_err(|_| "bad --concurrency")?
            }
            "--grace-secs" => {
                options.grace =
                    Duration::from_secs(value()?.parse().map_err(|_| "bad --grace-secs")?)
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if options.queue.is_empty() {
        return Err("--queue is required".into());
    }
    options.concurrency = options.concurrency.max(1);
    Ok(options)
}

/// What a running job's task is told from outside.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Stop {
    No,
    /// The lease ran out: another attempt may run the job; answer nothing.
    LeaseLost,
    /// An operator cancelled the job: stop and fail it.
    Cancelled,
    /// The worker is shutting down and the grace period is over: stop and fail it.
    Shutdown,
}

/// Tells the running job `id`, if this worker still runs it, why it must stop.
fn tell(stops: &HashMap<String, watch::Sender<Stop>>, id: &str, why: Stop) {
    if let Some(stop) = stops.get(id) {
        let _ = stop.send(why);
    }
}

/// The stream to send on: replaced on every reconnect, `None` while disconnected.
type CurrentStream = watch::Receiver<Option<WorkStream>>;

/// Sends a request on the current stream, moving to the next stream if this one breaks
/// (acks, fails and heartbeats of a lease may be sent on any stream of the worker).
async fn send_on_current<F, Fut>(
    current: &mut CurrentStream,
    what: &str,
    send: F,
) -> Result<jobbroker::v1::WorkResult, Status>
where
    F: Fn(WorkStream) -> Fut,
    Fut: std::future::Future<Output = Result<jobbroker::v1::WorkResult, Status>>,
{
    for _ in 0..10 {
        let stream = current.borrow_and_update().clone();
        let Some(stream) = stream else {
            if current.changed().await.is_err() {
                break;
            }
            continue;
        };
        match send(stream).await {
            Err(s) if s.code() == Code::Unavailable => {
                eprintln!(
                    "worker: {what}: {}; retrying on the next stream",
                    s.message()
                );
                let _ = tokio::time::timeout(Duration::from_secs(5), current.changed()).await;
            }
            other => return other,
        }
    }
    Err(Status::unavailable(format!("{what}: no stream to send on")))
}

/// Runs one job: heartbeats while the handler works, then acks or fails it.
async fn run_job(job: LeasedJob, mut current: CurrentStream, mut stop: watch::Receiver<Stop>) {
    // The lease length: the deadline the job arrived with, less now.
    let lease = job
        .lease_deadline
        .as_ref()
        .and_then(|d| {
            let deadline = std::time::UNIX_EPOCH
                + Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32);
            deadline.duration_since(std::time::SystemTime::now()).ok()
        })
        .unwrap_or(Duration::from_secs(30))
        .max(Duration::from_millis(300));

    // Heartbeats run beside the handler; they end only when the lease is gone or cancelled.
    let heartbeat_stream = current.clone();
    let heartbeats = async {
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + lease / 3, lease / 3);
        loop {
            ticker.tick().await;
            let Some(stream) = heartbeat_stream.borrow().clone() else {
                continue; // disconnected: the next stream carries the next beat
            };
            match stream.heartbeat(&job, None).await {
                Ok(r) if r.cancel_requested => return Stop::Cancelled,
                Ok(_) => {}
                Err(s) if s.code() == Code::FailedPrecondition => return Stop::LeaseLost,
                Err(s) => eprintln!("worker: heartbeat of {}: {s}", job.job_id),
            }
        }
    };
    let stopped = async {
        loop {
            if stop.changed().await.is_err() {
                return Stop::Shutdown;
            }
            let why = *stop.borrow();
            if why != Stop::No {
                return why;
            }
        }
    };
    let outcome = tokio::select! {
        done = handle(&job) => done,
        why = heartbeats => Err(JobError::interrupted(why)),
        why = stopped => Err(JobError::interrupted(why)),
    };

    let result = match outcome {
        Err(JobError {
            interrupted: Some(Stop::LeaseLost),
            ..
        }) => {
            eprintln!("worker: job {}: lease lost; abandoned", job.job_id);
            return;
        }
        Ok(result) => send_on_current(&mut current, "ack", |s| {
            let (job, result) = (job.clone(), result.clone());
            async move { s.ack(&job, result).await }
        })
        .await
        .map(|_| "completed"),
        Err(e) => send_on_current(&mut current, "fail", |s| {
            let (job, message) = (job.clone(), e.message.clone());
            async move { s.fail(&job, &message, e.permanent, None).await }
        })
        .await
        .map(|_| "failed"),
    };
    match result {
        Ok(what) => println!("worker: {what} {} (attempt {})", job.job_id, job.attempt),
        Err(s) => eprintln!("worker: answering {}: {s}", job.job_id),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "worker: {e}\nusage: worker --address HOST:PORT --queue QUEUE [--concurrency N] [--worker-id ID] [--grace-secs S]"
            );
            std::process::exit(2);
        }
    };
    match run(options).await {
        Ok(()) => println!("worker: stopped"),
        Err(e) => {
            eprintln!("worker: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(options: Options) -> Result<(), String> {
    let client = Client::connect_lazy(&options.address).map_err(|e| e.to_string())?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let (current_tx, current_rx) = watch::channel::<Option<WorkStream>>(None);
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut stops: HashMap<String, watch::Sender<Stop>> = HashMap::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let mut backoff = Duration::from_millis(100);

    'connect: loop {
        let subscribe = SubscribeRequest {
            queues: vec![options.queue.clone()],
            worker_id: options.worker_id.clone(),
            max_in_flight: options.concurrency as i32,
            lease_duration: None,
            ..Default::default()
        };
        let (stream, mut events) = tokio::select! {
            r = client.work(subscribe) => match r {
                Ok(opened) => opened,
                Err(s) if s.code() == Code::InvalidArgument || s.code() == Code::PermissionDenied
                    || s.code() == Code::Unauthenticated => {
                    return Err(format!("subscription refused: {s}"));
                }
                Err(s) => {
                    eprintln!("worker: cannot subscribe ({}); retrying in {backoff:?}", s.message());
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = sigterm.recv() => break 'connect,
                        _ = sigint.recv() => break 'connect,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue 'connect;
                }
            },
            _ = sigterm.recv() => break 'connect,
            _ = sigint.recv() => break 'connect,
        };
        backoff = Duration::from_millis(100);
        let _ = current_tx.send(Some(stream.clone()));
        println!(
            "worker: subscribed to {} as {}",
            options.queue, options.worker_id
        );

        loop {
            tokio::select! {
                event = events.recv() => match event.unwrap_or(WorkEvent::Closed(None)) {
                    WorkEvent::Job(job) => {
                        let (stop_tx, stop_rx) = watch::channel(Stop::No);
                        stops.insert(job.job_id.clone(), stop_tx);
                        let (current, done) = (current_rx.clone(), done_tx.clone());
                        tasks.spawn(async move {
                            let id = job.job_id.clone();
                            run_job(job, current, stop_rx).await;
                            let _ = done.send(id);
                        });
                    }
                    WorkEvent::LeaseLost(id) => tell(&stops, &id, Stop::LeaseLost),
                    WorkEvent::CancelRequested(id) => tell(&stops, &id, Stop::Cancelled),
                    WorkEvent::Closed(end) => {
                        let _ = current_tx.send(None);
                        eprintln!("worker: stream ended ({end:?}); reconnecting in {backoff:?}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue 'connect;
                    }
                },
                Some(id) = done_rx.recv() => {
                    stops.remove(&id);
                }
                _ = sigterm.recv() => break,
                _ = sigint.recv() => break,
            }
        }

        // Graceful shutdown on this stream: no new jobs, finish the running ones, close.
        println!("worker: draining");
        if let Err(e) = stream.flow(0).await {
            eprintln!("worker: flow 0: {e}");
        }
        let deadline = tokio::time::Instant::now() + options.grace;
        let mut interrupted = false;
        loop {
            tokio::select! {
                joined = tasks.join_next() => if joined.is_none() { break },
                event = events.recv() => match event.unwrap_or(WorkEvent::Closed(None)) {
                    WorkEvent::Job(job) => {
                        // Pushed before our Flow{0} took effect: give it back unstarted.
                        let s = stream.clone();
                        tasks.spawn(async move {
                            if let Err(e) = s.release(&job).await {
                                eprintln!("worker: release of {}: {e}", job.job_id);
                            }
                        });
                    }
                    WorkEvent::LeaseLost(id) => tell(&stops, &id, Stop::LeaseLost),
                    WorkEvent::CancelRequested(id) => tell(&stops, &id, Stop::Cancelled),
                    WorkEvent::Closed(end) => {
                        // Nothing more can be acked; unfinished leases will run out.
                        eprintln!("worker: stream ended while draining ({end:?})");
                        let _ = current_tx.send(None);
                        break;
                    }
                },
                _ = tokio::time::sleep_until(deadline), if !interrupted => {
                    interrupted = true;
                    eprintln!("worker: grace period over; interrupting running jobs");
                    for stop in stops.values() {
                        let _ = stop.send(Stop::Shutdown);
                    }
                }
            }
        }
        stream.close();
        // Wait for the broker to end the stream (all results are in by now).
        while let Some(event) = events.recv().await {
            if matches!(event, WorkEvent::Closed(_)) {
                break;
            }
        }
        break 'connect;
    }
    drop(current_tx);
    tasks.shutdown().await;
    Ok(())
}
