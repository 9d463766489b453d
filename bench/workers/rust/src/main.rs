//! End-to-end bench of the Rust worker helper: the workload of
//! `jobbroker-bench stream --workers 1 --in-flight K --concurrency C --producer-batch B --jobs N`.
//!
//! Producers (C tasks) enqueue N jobs of --payload-bytes bytes in EnqueueBatch calls of B, C
//! calls in flight, while one `jobbroker::Worker` handles them with a no-op handler at
//! concurrency K. The run is timed from the first enqueue to the answer to the last ack (the
//! worker's graceful stop waits for it), as jobbroker-bench's stream mode is. Prints one text
//! line on stderr and one JSON line on stdout, with the fields of bench/workers/python_e2e.py
//! (mode "stream-rust").
//!
//! bench/workers/run.sh builds it (`cargo build --release`, target dir bench/workers/rust/target)
//! and runs it:
//!     target/release/rust_e2e --address 127.0.0.1:7070 --jobs 20000

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jobbroker::v1::EnqueueBatchRequest;
use jobbroker::{Client, Job, Worker, WorkerError};
use tokio::sync::{Mutex, Notify};

/// Stop producing after this many failed calls instead of spinning on errors (as
/// jobbroker-bench).
const MAX_ERRORS: i64 = 100;

struct Args {
    address: String,
    jobs: i64,
    in_flight: usize,
    concurrency: usize,
    producer_batch: usize,
    payload_bytes: usize,
    queue: String,
    timeout: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        address: "127.0.0.1:7070".into(),
        jobs: 20000,
        in_flight: 64,
        concurrency: 4,
        producer_batch: 100,
        payload_bytes: 100,
        queue: String::new(),
        timeout: Duration::from_secs(300),
    };
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.clone(), None),
        };
        let value = match inline.or_else(|| argv.next()) {
            Some(v) => v,
            None => return Err(format!("{flag} needs a value")),
        };
        let bad = |e: &dyn std::fmt::Display| format!("{name} {value}: {e}");
        match name.as_str() {
            "--address" => a.address = value.clone(),
            "--jobs" => a.jobs = value.parse().map_err(|e| bad(&e))?,
            "--in-flight" => a.in_flight = value.parse().map_err(|e| bad(&e))?,
            "--concurrency" => a.concurrency = value.parse().map_err(|e| bad(&e))?,
            "--producer-batch" => a.producer_batch = value.parse().map_err(|e| bad(&e))?,
            "--payload-bytes" => a.payload_bytes = value.parse().map_err(|e| bad(&e))?,
            "--queue" => a.queue = value.clone(),
            "--timeout" => a.timeout = Duration::from_secs_f64(value.parse().map_err(|e| bad(&e))?),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.queue.is_empty() {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        a.queue = format!("bench-stream-rust-{}-{ms}", std::process::id());
    }
    Ok(a)
}

/// jobbroker-bench's percentile: the sample at index min(n-1, p/100*n), in ms.
fn percentile_ms(sorted_micros: &[i64], p: f64) -> f64 {
    if sorted_micros.is_empty() {
        return 0.0;
    }
    let i = (sorted_micros.len() - 1).min((p / 100.0 * sorted_micros.len() as f64) as usize);
    sorted_micros[i] as f64 / 1000.0
}

fn round(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale
}

/// A JSON number as python_e2e.py's json.dumps writes a float: always with a fraction.
fn float(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The broker's count of acked attempts of `queue` since it started; 0 for a queue it does not
/// know yet.
async fn completed_total(client: &Client, queue: &str) -> Result<i64, jobbroker::Status> {
    match client.get_queue(queue).await {
        Ok(info) => Ok(info.completed_total),
        Err(status) if status.code() == jobbroker::Code::NotFound => Ok(0),
        Err(status) => Err(status),
    }
}

/// What the handler shares with main: the warm-up's and the run's progress.
struct Progress {
    warming: AtomicBool,
    warmed: Notify,
    handled: AtomicI64,
    all_handled: Notify,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rust_e2e: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rust_e2e: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + args.timeout;
    let progress = Arc::new(Progress {
        warming: AtomicBool::new(true),
        warmed: Notify::new(),
        handled: AtomicI64::new(0),
        all_handled: Notify::new(),
    });

    // The worker makes its own client from the address, so it has its own connection, as in the
    // other languages' benches and jobbroker-bench (a Worker has its own channel there).
    let mut worker = Worker::builder(args.address.as_str())
        .concurrency(args.in_flight)
        .worker_id(format!("bench-stream-rust-{}", std::process::id()))
        .build()?;
    let jobs = args.jobs;
    let shared = progress.clone();
    worker.handle(args.queue.clone(), move |_job: Job| {
        let p = shared.clone();
        async move {
            // The warm-up job is the only job until warming is cleared, so the first call is it.
            if p.warming.load(Ordering::Acquire) {
                p.warmed.notify_one();
            } else if p.handled.fetch_add(1, Ordering::AcqRel) + 1 == jobs {
                p.all_handled.notify_one();
            }
            Ok::<(), WorkerError>(())
        }
    });
    let stop = worker.shutdown_handle();
    let mut running = tokio::spawn(worker.run());

    let client = Client::new(args.address.as_str())?;
    // Worker has no stats: what it acked is read from the broker, as the queue's count of acked
    // attempts (completed_total) after the run less this count from before it.
    let completed_before = completed_total(&client, &args.queue).await?;
    // One job before the clock starts: the worker has subscribed once it is handled (Worker::run
    // has no "subscribed" signal; jobbroker-bench's Worker::Start waits for the same thing).
    client
        .enqueue(jobbroker::job(&args.queue, vec![b'w'; args.payload_bytes]))
        .await?;
    tokio::select! {
        _ = progress.warmed.notified() => {}
        ended = &mut running => {
            return Err(format!("the worker ended before the warm-up job: {ended:?}").into());
        }
        _ = tokio::time::sleep(Duration::from_secs(60)) => {
            return Err("warm-up job not handled within 60 s".into());
        }
    }
    progress.warming.store(false, Ordering::Release);
    // The warm-up's ack reaches the broker a moment after its handler ran: wait for it, so that
    // the count taken off below is exactly the warm-up's.
    let warm_by = Instant::now() + Duration::from_secs(10);
    let mut warm_completed = completed_total(&client, &args.queue).await?;
    while warm_completed <= completed_before && Instant::now() < warm_by {
        tokio::time::sleep(Duration::from_millis(1)).await;
        warm_completed = completed_total(&client, &args.queue).await?;
    }

    // The same request every call (the jobs are identical): the producers' own cost stays out of
    // the measurement as far as it can, as jobbroker-bench's C++ producers do (tonic takes the
    // request by value, so each call clones it).
    let one = jobbroker::job(&args.queue, vec![b'p'; args.payload_bytes]);
    let batch_of = |n: usize| EnqueueBatchRequest {
        jobs: vec![one.clone(); n],
    };
    let full: Arc<EnqueueBatchRequest> = Arc::new(batch_of(args.producer_batch));
    let next = Arc::new(AtomicI64::new(0));
    let errors = Arc::new(AtomicI64::new(0));
    let aborted = Arc::new(AtomicBool::new(false));
    let first_error = Arc::new(Mutex::new(String::new()));

    let start = Instant::now();
    let mut producers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let mut broker = client.broker();
        let (next, errors, aborted, first_error, full) = (
            next.clone(),
            errors.clone(),
            aborted.clone(),
            first_error.clone(),
            full.clone(),
        );
        let (batch, one) = (args.producer_batch, one.clone());
        producers.spawn(async move {
            let mut latencies = Vec::new();
            while !aborted.load(Ordering::Relaxed) && Instant::now() < deadline {
                let first = next.fetch_add(batch as i64, Ordering::Relaxed);
                if first >= jobs {
                    break;
                }
                let n = (batch as i64).min(jobs - first) as usize;
                let body = if n == batch {
                    (*full).clone()
                } else {
                    EnqueueBatchRequest {
                        jobs: vec![one.clone(); n],
                    }
                };
                let mut request = jobbroker::tonic::Request::new(body);
                request.set_timeout(Duration::from_secs(30));
                let sent = Instant::now();
                match broker.enqueue_batch(request).await {
                    Ok(_) => latencies.push(sent.elapsed().as_micros() as i64),
                    Err(status) => {
                        if errors.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_ERRORS {
                            aborted.store(true, Ordering::Relaxed);
                        }
                        let mut first = first_error.lock().await;
                        if first.is_empty() {
                            *first =
                                format!("EnqueueBatch: {:?}: {}", status.code(), status.message());
                        }
                    }
                }
            }
            latencies
        });
    }
    let mut latencies: Vec<i64> = Vec::new();
    while let Some(done) = producers.join_next().await {
        latencies.extend(done?);
    }
    let mut timed_out = false;
    if !aborted.load(Ordering::Relaxed) {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        timed_out = tokio::time::timeout(left, progress.all_handled.notified())
            .await
            .is_err();
    }
    // The graceful stop returns once the broker has answered the last ack.
    stop.shutdown();
    running.await??;
    let seconds = start.elapsed().as_secs_f64();

    // The broker's count of acked attempts of this run's queue (a fresh queue; the warm-up's ack
    // taken off): what the other benches read from their Worker's stats.
    let acked = completed_total(&client, &args.queue).await? - warm_completed;
    latencies.sort_unstable();
    let errors = errors.load(Ordering::Relaxed);
    let late = timed_out && acked < jobs;
    let first_error = first_error.lock().await.clone();
    let jobs_per_sec = if seconds > 0.0 {
        round(acked as f64 / seconds, 1)
    } else {
        0.0
    };
    let runtime = format!(
        "rust {}, tonic {}",
        env!("BENCH_RUSTC_VERSION"),
        env!("BENCH_TONIC_VERSION")
    );
    // python_e2e.py's fields, in its order. The Worker counts neither ack messages nor refused
    // acks: both are 0, as python_e2e.py reports a count its Worker lacks.
    let line = [
        "{\"mode\":\"stream-rust\"".to_string(),
        format!("\"address\":{}", json_string(&args.address)),
        format!("\"concurrency\":{}", args.concurrency),
        "\"workers\":1".to_string(),
        format!("\"jobs\":{jobs}"),
        format!("\"done\":{acked}"),
        format!("\"payload_bytes\":{}", args.payload_bytes),
        format!("\"seconds\":{}", float(round(seconds, 4))),
        format!("\"jobs_per_sec\":{}", float(jobs_per_sec)),
        format!("\"in_flight\":{}", args.in_flight),
        format!("\"producer_batch\":{}", args.producer_batch),
        "\"latency_of\":\"enqueue\"".to_string(),
        format!("\"p50_ms\":{}", float(percentile_ms(&latencies, 50.0))),
        format!("\"p90_ms\":{}", float(percentile_ms(&latencies, 90.0))),
        format!("\"p99_ms\":{}", float(percentile_ms(&latencies, 99.0))),
        format!("\"max_ms\":{}", float(percentile_ms(&latencies, 100.0))),
        format!("\"errors\":{errors}"),
        format!("\"timed_out\":{late}"),
        format!("\"first_error\":{}", json_string(&first_error)),
        "\"ack_messages\":0".to_string(),
        "\"acks_refused\":0".to_string(),
        format!("\"runtime\":{}}}", json_string(&runtime)),
    ]
    .join(",");
    eprintln!(
        "stream-rust in_flight={} jobs={jobs} done={acked} seconds={seconds:.3} \
         jobs_per_sec={jobs_per_sec:.1} ack_messages=0 errors={errors}{}",
        args.in_flight,
        if late { " TIMED_OUT" } else { "" }
    );
    println!("{line}");
    Ok(if acked >= jobs && errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
