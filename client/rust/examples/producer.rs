//! A complete jobbroker producer: enqueues one job and waits for its result.
//!
//!     cargo run --example producer -- --queue emails [--address 127.0.0.1:7070] [--ca ca.pem]
//!         [--timeout-secs 30] PAYLOAD
//!
//! Without `--address`, the library's options take `$JOBBROKER_ADDRESS` (else
//! 127.0.0.1:7070); the bearer token, if any, comes from `$JOBBROKER_TOKEN`. Prints
//! `job <id> completed: <result>` and exits 0, or the error and exits 1.

use std::time::Duration;

use jobbroker::{Client, ClientOptions, job};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut options = ClientOptions::new();
    let (mut queue, mut payload, mut timeout) = (None, None, Duration::from_secs(30));
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next().unwrap_or_else(|| {
                eprintln!("producer: {arg} needs a value");
                std::process::exit(2)
            })
        };
        match arg.as_str() {
            "--address" => options = options.address(value()),
            "--ca" => options = options.tls_ca_file(value()),
            "--queue" => queue = Some(value()),
            "--timeout-secs" => timeout = Duration::from_secs(value().parse().unwrap_or(30)),
            _ => payload = Some(arg),
        }
    }
    let (Some(queue), Some(payload)) = (queue, payload) else {
        eprintln!("usage: producer --queue QUEUE [--address HOST:PORT] [--ca FILE] PAYLOAD");
        std::process::exit(2)
    };
    let client = Client::new(options).unwrap_or_else(|e| {
        eprintln!("producer: {e}");
        std::process::exit(2)
    });
    match client
        .enqueue_and_wait(job(&queue, payload), Some(timeout))
        .await
    {
        Ok(done) => println!(
            "job {} completed: {}",
            done.id,
            String::from_utf8_lossy(&done.result)
        ),
        Err(e) => {
            eprintln!("producer: {e}");
            std::process::exit(1)
        }
    }
}
