//! The Rust conformance worker of `tests/interop/CONFORMANCE.md`: the shortest program on the
//! library [`Worker`] that reaches every behaviour the harness checks. Its CLI, events file and
//! payload actions are defined there; `tests/interop/rust/run.sh` starts it.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobbroker::{ClientOptions, Job, Worker, WorkerError};
use serde_json::{Value, json};

struct Options {
    address: String,
    queues: Vec<String>,
    events: PathBuf,
    concurrency: usize,
    prefetch: usize,
    lease_ms: u64,
    grace_ms: u64,
    die_at_step: Option<String>,
    die_after_user: Option<String>,
    outbox: Option<PathBuf>,
    idempotent: bool,
    lang_name: String,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    token: Option<String>,
}

fn parse_args() -> Result<Options, String> {
    let mut address = None;
    let mut queues = None;
    let mut events = None;
    let mut options = Options {
        address: String::new(),
        queues: Vec::new(),
        events: PathBuf::new(),
        concurrency: 1,
        prefetch: 0,
        lease_ms: 0,
        grace_ms: 10_000,
        die_at_step: None,
        die_after_user: None,
        outbox: None,
        idempotent: false,
        lang_name: "rust".into(),
        ca: None,
        cert: None,
        key: None,
        token: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--idempotent" {
            options.idempotent = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<u64>().map_err(|_| format!("bad {flag}: {v}"));
        match flag.as_str() {
            "--address" => address = Some(value),
            "--queues" => queues = Some(value.split(',').map(str::to_string).collect()),
            "--events" => events = Some(PathBuf::from(value)),
            "--concurrency" => options.concurrency = number(&value)? as usize,
            "--prefetch" => options.prefetch = number(&value)? as usize,
            "--lease-ms" => options.lease_ms = number(&value)?,
            "--grace-ms" => options.grace_ms = number(&value)?,
            "--die-at-step" => options.die_at_step = Some(value),
            "--die-after-user" => options.die_after_user = Some(value),
            "--outbox" => options.outbox = Some(PathBuf::from(value)),
            "--lang-name" => options.lang_name = value,
            "--ca" => options.ca = Some(PathBuf::from(value)),
            "--cert" => options.cert = Some(PathBuf::from(value)),
            "--key" => options.key = Some(PathBuf::from(value)),
            "--token" => options.token = Some(value),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    options.address = address.ok_or("--address is required")?;
    options.queues = queues.ok_or("--queues is required")?;
    options.events = events.ok_or("--events is required")?;
    if options.cert.is_some() != options.key.is_some() {
        return Err("--cert and --key go together".into());
    }
    Ok(options)
}

/// The events file: one JSON object per line, each written with one `write` on an append-mode
/// file, so the harness can read it while the worker runs and after a SIGKILL.
struct Events(Mutex<File>);

impl Events {
    fn write(&self, event: Value) {
        let line = format!("{event}\n");
        let mut file = self.0.lock().unwrap();
        file.write_all(line.as_bytes()).expect("write events");
    }

    fn about(&self, name: &str, job: &Job, extra: Value) {
        let mut event = json!({"event": name, "job": job.id(), "attempt": job.attempt()});
        if let (Value::Object(event), Value::Object(extra)) = (&mut event, extra) {
            event.extend(extra);
        }
        self.write(event);
    }
}

fn kill_myself() -> ! {
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    // The signal is on its way; never return into the handler.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// What every handler shares.
struct Shared {
    options: Options,
    events: Events,
    /// Job ids this process has snoozed once already.
    snoozed: Mutex<HashSet<String>>,
}

fn number(payload: &Value, field: &str) -> Option<u64> {
    payload.get(field).and_then(Value::as_u64)
}

fn text(payload: &Value, field: &str) -> String {
    payload
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// True while the attempt is before `ok_from_attempt` (absent: always).
fn before_ok_attempt(payload: &Value, job: &Job) -> bool {
    number(payload, "ok_from_attempt").is_none_or(|from| (job.attempt() as u64) < from)
}

async fn handle(shared: Arc<Shared>, queue: String, job: Job) -> Result<Value, WorkerError> {
    let events = &shared.events;
    events.about(
        "start",
        &job,
        json!({"queue": job.queue(), "handler": queue}),
    );
    let payload: Value = job.json()?;
    let cancelled = || {
        events.about("cancelled", &job, json!({}));
        Err(WorkerError::Cancelled)
    };
    match payload.get("action").and_then(Value::as_str).unwrap_or("") {
        "ok" => {}
        "sleep" => {
            let ms = number(&payload, "ms").unwrap_or(0);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                _ = job.cancelled() => return cancelled(),
            }
        }
        "wait_cancel" => {
            if before_ok_attempt(&payload, &job) {
                job.cancelled().await;
                if payload.get("after_cancel").and_then(Value::as_str) != Some("return") {
                    return cancelled();
                }
                // Saw the cancel, yet the work was done: return as `ok`.
                events.about("cancelled", &job, json!({}));
            }
        }
        "ignore_cancel" => {
            if before_ok_attempt(&payload, &job) {
                // A handler stuck in a blocking call: it never looks at its token.
                let ms = number(&payload, "ms").unwrap_or(0);
                tokio::task::spawn_blocking(move || std::thread::sleep(Duration::from_millis(ms)))
                    .await
                    .map_err(WorkerError::other)?;
            }
        }
        "fail" => {
            if before_ok_attempt(&payload, &job) {
                return Err(WorkerError::other(text(&payload, "message")));
            }
        }
        "permanent" => return Err(WorkerError::permanent(text(&payload, "message"))),
        "retry_after" => {
            if job.attempt() == 1 {
                let delay = Duration::from_millis(number(&payload, "ms").unwrap_or(0));
                return Err(WorkerError::retry_after(delay, text(&payload, "message")));
            }
        }
        "snooze" => {
            if shared.snoozed.lock().unwrap().insert(job.id().to_string()) {
                let delay = Duration::from_millis(number(&payload, "ms").unwrap_or(0));
                return Err(WorkerError::snooze(delay));
            }
        }
        "progress" => {
            job.progress(&json!({"percent": payload.get("percent")}))?;
            let gate = PathBuf::from(text(&payload, "gate"));
            while !gate.exists() {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    _ = job.cancelled() => return cancelled(),
                }
            }
        }
        "steps" => {
            let mut results = serde_json::Map::new();
            let names = payload.get("steps").and_then(Value::as_array).cloned();
            for name in names.unwrap_or_default() {
                let name = name.as_str().unwrap_or_default().to_string();
                let result: Value = job
                    .step(&name, async {
                        events.about("step", &job, json!({"step": name}));
                        if shared.options.die_at_step.as_deref() == Some(name.as_str()) {
                            kill_myself();
                        }
                        Ok(json!({"by": shared.options.lang_name, "step": name}))
                    })
                    .await?;
                results.insert(name, result);
            }
            events.about("done", &job, json!({}));
            return Ok(Value::Object(results));
        }
        "signup" => {
            let user = text(&payload, "user");
            send_welcome(&shared.options, &job, &user)?;
            if shared.options.die_after_user.as_deref() == Some(user.as_str()) {
                kill_myself();
            }
        }
        other => return Err(WorkerError::permanent(format!("unknown action {other:?}"))),
    }
    events.about("done", &job, json!({}));
    Ok(json!({"queue": queue, "echo": payload.get("echo").cloned().unwrap_or(Value::Null)}))
}

/// The fake email provider: appends `{"user", "key"}` to the outbox. With --idempotent the key
/// is the job's idempotency key and a key already in the outbox is not sent again.
fn send_welcome(options: &Options, job: &Job, user: &str) -> Result<(), WorkerError> {
    let outbox = options
        .outbox
        .as_ref()
        .ok_or_else(|| WorkerError::permanent("signup needs --outbox"))?;
    let key = if options.idempotent {
        job.idempotency_key().to_string()
    } else {
        format!("{}/{}", job.id(), job.attempt())
    };
    if options.idempotent && outbox.exists() {
        for line in BufReader::new(File::open(outbox)?).lines() {
            let sent: Value = serde_json::from_str(&line?).unwrap_or(Value::Null);
            if sent.get("key").and_then(Value::as_str) == Some(key.as_str()) {
                return Ok(());
            }
        }
    }
    let line = format!("{}\n", json!({"user": user, "key": key}));
    let mut file = OpenOptions::new().create(true).append(true).open(outbox)?;
    file.write_all(line.as_bytes())?;
    file.sync_data()?;
    Ok(())
}

/// The connection flags as the library's client options, the same ones a user sets.
fn client_options(options: &Options) -> ClientOptions {
    // Several addresses (the nodes of a cluster) come comma-separated, in the order to try:
    // the options take that form as it is.
    let mut client = ClientOptions::new().address(options.address.clone());
    if let Some(ca) = &options.ca {
        client = client.tls_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&options.cert, &options.key) {
        client = client.client_cert_files(cert, key);
    }
    if let Some(token) = &options.token {
        client = client.token(token.clone());
    }
    client
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = match parse_args() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("conformance_worker: {e}");
            std::process::exit(2);
        }
    };
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&options.events)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", options.events.display()));
    let mut builder = Worker::builder(client_options(&options))
        .concurrency(options.concurrency)
        .prefetch(options.prefetch)
        .grace(Duration::from_millis(options.grace_ms));
    if options.lease_ms > 0 {
        builder = builder.lease(Duration::from_millis(options.lease_ms));
    }
    let mut worker = match builder.build() {
        Ok(worker) => worker,
        Err(e) => {
            eprintln!("conformance_worker: {e}");
            std::process::exit(1);
        }
    };
    let queues = options.queues.clone();
    let shared = Arc::new(Shared {
        options,
        events: Events(Mutex::new(file)),
        snoozed: Mutex::new(HashSet::new()),
    });
    for queue in queues {
        let (shared, handler_queue) = (shared.clone(), queue.clone());
        worker.handle(queue, move |job: Job| {
            handle(shared.clone(), handler_queue.clone(), job)
        });
    }
    shared.events.write(json!({"event": "ready"}));
    if let Err(e) = worker.run_until_signal().await {
        eprintln!("conformance_worker: {e}");
        std::process::exit(1);
    }
    shared.events.write(json!({"event": "stopped"}));
    // Exit now: dropping the runtime would wait for a handler still stuck in a blocking call.
    std::process::exit(0);
}
