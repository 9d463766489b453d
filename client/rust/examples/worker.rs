//! A complete jobbroker worker on the library [`Worker`].
//!
//!     cargo run --example worker -- --address 127.0.0.1:7070 --queue emails [--concurrency 4]
//!         [--worker-id NAME] [--grace-secs 30] [--ca ca.pem [--cert c.pem --key c.key]]
//!
//! Without `--address`, the library's options take `$JOBBROKER_ADDRESS` (else
//! 127.0.0.1:7070); the bearer token, if any, comes from `$JOBBROKER_TOKEN` (not a flag: every
//! user of the machine can read a command line).
//!
//! The library does the rest: heartbeats every third of the lease, ack / fail / release from
//! what the handler returns, operator cancels, lost leases and time-outs through the job's
//! cancellation token, reconnects with backoff, and on SIGTERM/SIGINT the graceful stop (no new
//! jobs, jobs not started released, running ones finish within `--grace-secs`, exit 0).
//!
//! The demo handler reads the payload as text: `sleep:MS` works MS milliseconds (saying so as it
//! starts, stopping early when cancelled), `fail` always fails (retried), `flaky` fails on its
//! first attempt only, `poison` fails permanently; anything else succeeds at once with the
//! upper-cased payload as the result.

use std::time::Duration;

use jobbroker::{ClientOptions, Job, Worker, WorkerError};

/// The work itself. Replace with your own.
async fn handle(job: Job) -> Result<String, WorkerError> {
    let text = job.text()?;
    if let Some(ms) = text.strip_prefix("sleep:") {
        let ms: u64 = ms
            .trim()
            .parse()
            .map_err(|_| WorkerError::permanent("bad sleep payload"))?;
        println!("worker: job {} sleeps {ms} ms", job.id());
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
            _ = job.cancelled() => return Err(WorkerError::Cancelled),
        }
        return Ok(format!("slept {ms} ms"));
    }
    match text {
        "fail" => Err(WorkerError::other("demo failure")),
        "flaky" if job.attempt() == 1 => Err(WorkerError::other("flaky: first attempt fails")),
        "poison" => Err(WorkerError::permanent("poison payload")),
        _ => Ok(text.to_uppercase()),
    }
}

struct Options {
    connection: ClientOptions,
    queue: String,
    worker_id: Option<String>,
    concurrency: usize,
    grace: Duration,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        connection: ClientOptions::new(),
        queue: String::new(),
        worker_id: None,
        concurrency: 4,
        grace: Duration::from_secs(30),
    };
    let (mut cert, mut key) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--address" => options.connection = options.connection.address(value()?),
            "--ca" => options.connection = options.connection.tls_ca_file(value()?),
            "--cert" => cert = Some(value()?),
            "--key" => key = Some(value()?),
            "--queue" => options.queue = value()?,
            "--worker-id" => options.worker_id = Some(value()?),
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
    match (cert, key) {
        (Some(cert), Some(key)) => {
            options.connection = options.connection.client_cert_files(cert, key);
        }
        (None, None) => {}
        _ => return Err("--cert and --key go together".into()),
    }
    Ok(options)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = parse_args().unwrap_or_else(|e| {
        eprintln!(
            "worker: {e}\nusage: worker [--address HOST:PORT] --queue QUEUE [--concurrency N] [--worker-id ID] [--grace-secs S] [--ca FILE [--cert FILE --key FILE]]"
        );
        std::process::exit(2);
    });
    let mut builder = Worker::builder(options.connection)
        .concurrency(options.concurrency)
        .grace(options.grace);
    if let Some(id) = options.worker_id {
        builder = builder.worker_id(id);
    }
    let mut worker = builder.build().unwrap_or_else(|e| {
        eprintln!("worker: {e}");
        std::process::exit(2);
    });
    worker.handle(options.queue.clone(), handle);
    println!(
        "worker: working {} as {}",
        options.queue,
        worker.worker_id()
    );
    match worker.run_until_signal().await {
        Ok(()) => println!("worker: stopped"),
        Err(e) => {
            eprintln!("worker: {e}");
            std::process::exit(1);
        }
    }
}
