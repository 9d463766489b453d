//! The library `Worker` against the real broker: handlers per queue, results, the errors that
//! decide retries, cancellation (operator, time-out, end of grace), heartbeats, graceful stop,
//! durable steps, progress, many acks at once, reconnecting after a broker crash, and the
//! client metadata. (tests/interop/conformance.py checks the same contract across languages.)

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Broker, GIVE_UP, Running, port_of, tcp_established, wait_for_state};
use jobbroker::v1::{
    AttemptOutcome, CancelJobRequest, EnqueueRequest, FailReason, FailRequest, HeartbeatRequest,
    JobState, LeaseRequest, ListWorkersRequest, StepCheckpoint, SubscribeRequest,
};
use jobbroker::{
    CLIENT_NAME, CancelReason, Client, ClientOptions, Code, Job, RunError, WorkEvent, Worker,
    WorkerError, duration, job,
};
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// Queues with 3 attempts, 50 ms backoff without jitter and a 1 s lease.
const CONFIG: &str = r#"{"queues": {
  "w": {"retry": {"maxAttempts": 3, "initialBackoff": "0.05s", "jitter": "JITTER_NONE"}, "leaseDuration": "1s"}
}}"#;

fn worker_for(broker: &Broker) -> jobbroker::WorkerBuilder {
    Worker::builder(broker.addr.clone()).worker_id("rust-worker-test")
}

async fn enqueue(client: &Client, request: EnqueueRequest) -> String {
    client.enqueue(request).await.expect("enqueue").job_id
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("JSON")
}

#[tokio::test]
async fn each_queue_has_its_handler_and_results_are_bytes_text_or_json() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let mut worker = worker_for(&broker).concurrency(2).build().unwrap();
    worker.handle("bytes", |job: Job| async move {
        Ok([job.payload(), b"!"].concat())
    });
    worker.handle("text", |job: Job| async move {
        Ok(format!("{} on {}", job.text()?, job.queue()))
    });
    worker.handle("json", |job: Job| async move {
        let payload: Value = job.json()?;
        Ok(json!({
            "queue": job.queue(),
            "n": payload["n"],
            "header": job.headers().get("trace"),
            "attempt": job.attempt(),
            "key_is_the_id": job.idempotency_key() == job.id(),
        }))
    });
    let running = Running::start(worker);

    let bytes = enqueue(&client, job("bytes", vec![0u8, 1, 2])).await;
    let text = enqueue(&client, job("text", "héllo")).await;
    let mut request = job("json", r#"{"n": 7}"#);
    request.headers.insert("trace".into(), "t-1".into());
    let json = enqueue(&client, request).await;

    let done = wait_for_state(&client, &bytes, JobState::Completed).await;
    assert_eq!(done.result, vec![0u8, 1, 2, b'!']);
    let done = wait_for_state(&client, &text, JobState::Completed).await;
    assert_eq!(String::from_utf8(done.result).unwrap(), "héllo on text");
    let done = wait_for_state(&client, &json, JobState::Completed).await;
    assert_eq!(
        json_of(&done.result),
        json!({"queue": "json", "n": 7, "header": "t-1", "attempt": 1, "key_is_the_id": true})
    );

    // Every call carries the library's name, which ListWorkers shows.
    let workers = client
        .admin()
        .list_workers(ListWorkersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .workers;
    let me = workers
        .iter()
        .find(|w| w.worker_id == "rust-worker-test")
        .expect("the worker is listed");
    assert_eq!(me.client, CLIENT_NAME);
    assert!(me.client.starts_with("jobbroker-rust/"));
    assert_eq!(me.max_in_flight, 2, "concurrency + prefetch");

    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_handlers_error_decides_what_happens_to_the_job() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let mut worker = worker_for(&broker).concurrency(4).build().unwrap();
    worker.handle("w", |job: Job| async move {
        match (job.text()?, job.attempt()) {
            ("permanent", _) => Err(WorkerError::permanent("no such mailbox")),
            ("retry_after", 1) => Err(WorkerError::retry_after(
                Duration::from_secs(3600),
                "429 from the provider",
            )),
            ("snooze", _) => Err(WorkerError::snooze(Duration::from_secs(3600))),
            ("other", 1) => Err(WorkerError::other("provider timed out")),
            ("panic", 1) => panic!("kaboom"),
            _ => Ok("done"),
        }
    });
    let running = Running::start(worker);

    let permanent = enqueue(&client, job("w", "permanent")).await;
    let retry_after = enqueue(&client, job("w", "retry_after")).await;
    let snooze = enqueue(&client, job("w", "snooze")).await;
    let other = enqueue(&client, job("w", "other")).await;
    let panics = enqueue(&client, job("w", "panic")).await;

    let dead = wait_for_state(&client, &permanent, JobState::Failed).await;
    assert_eq!(dead.fail_reason, FailReason::Permanent as i32);
    assert_eq!(dead.attempt, 1);
    assert_eq!(dead.last_error, "no such mailbox");

    // The handler's delay, not the queue's 50 ms backoff.
    let waiting = wait_for_state(&client, &retry_after, JobState::Scheduled).await;
    let ended = waiting.attempts[0].ended_at.unwrap().seconds;
    assert!(
        waiting.run_at.unwrap().seconds - ended >= 3000,
        "run_at {:?} is not an hour after the attempt ended ({ended})",
        waiting.run_at
    );
    assert_eq!(waiting.attempts[0].error, "429 from the provider");

    // Snoozed: later, without spending an attempt.
    let snoozed = wait_for_state(&client, &snooze, JobState::Scheduled).await;
    assert_eq!(snoozed.snoozes, 1);
    assert!(snoozed.last_error.is_empty(), "{}", snoozed.last_error);

    let done = wait_for_state(&client, &other, JobState::Completed).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(done.attempts[0].outcome, AttemptOutcome::Error as i32);
    assert_eq!(done.attempts[0].error, "provider timed out");

    // A panic fails the attempt only: the worker goes on and attempt 2 completes.
    let done = wait_for_state(&client, &panics, JobState::Completed).await;
    assert_eq!(done.attempt, 2);
    assert!(
        done.attempts[0].error.contains("kaboom"),
        "{}",
        done.attempts[0].error
    );

    running.stop().await.unwrap();
}

/// What a handler of [`report_cancellation`] saw.
#[derive(Debug, PartialEq)]
enum Seen {
    Started,
    Cancelled(CancelReason),
}

/// A handler that says it started, waits for its cancellation and says why it fired.
fn report_cancellation(worker: &mut Worker, queue: &str) -> mpsc::UnboundedReceiver<Seen> {
    let (seen_tx, seen) = mpsc::unbounded_channel();
    worker.handle(queue, move |job: Job| {
        let seen = seen_tx.clone();
        async move {
            let _ = seen.send(Seen::Started);
            job.cancelled().await;
            let _ = seen.send(Seen::Cancelled(job.cancel_reason().expect("a reason")));
            Err::<(), _>(WorkerError::Cancelled)
        }
    });
    seen
}

async fn next_seen(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(GIVE_UP, seen.recv())
        .await
        .expect("the handler said nothing")
        .expect("the handler is gone")
}

#[tokio::test]
async fn an_operator_cancel_fires_the_token_and_the_job_stays_cancelled() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let mut worker = worker_for(&broker).build().unwrap();
    let mut seen = report_cancellation(&mut worker, "w");
    let running = Running::start(worker);

    let id = enqueue(&client, job("w", "x")).await;
    assert_eq!(next_seen(&mut seen).await, Seen::Started);
    client
        .admin()
        .cancel_job(CancelJobRequest { job_id: id.clone() })
        .await
        .unwrap();
    assert_eq!(
        next_seen(&mut seen).await,
        Seen::Cancelled(CancelReason::Operator)
    );
    let cancelled = wait_for_state(&client, &id, JobState::Cancelled).await;
    assert_eq!(cancelled.attempt, 1);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_token_fires_at_the_attempts_time_out() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let mut worker = worker_for(&broker).build().unwrap();
    let mut seen = report_cancellation(&mut worker, "w");
    let running = Running::start(worker);

    let id = enqueue(
        &client,
        EnqueueRequest {
            timeout: Some(duration(Duration::from_millis(300))),
            max_attempts: 1,
            ..job("w", "x")
        },
    )
    .await;
    assert_eq!(next_seen(&mut seen).await, Seen::Started);
    assert_eq!(
        next_seen(&mut seen).await,
        Seen::Cancelled(CancelReason::TimedOut)
    );
    let dead = wait_for_state(&client, &id, JobState::Failed).await;
    assert_eq!(dead.attempts[0].outcome, AttemptOutcome::TimedOut as i32);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn heartbeats_keep_a_job_alive_past_its_lease() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    // Four leases long: only heartbeats every third of the lease keep attempt 1 alive.
    let mut worker = worker_for(&broker)
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    worker.handle("w", |_job: Job| async move {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        Ok("slept")
    });
    let running = Running::start(worker);
    let id = enqueue(&client, job("w", "x")).await;
    let done = wait_for_state(&client, &id, JobState::Completed).await;
    assert_eq!(done.attempt, 1);
    assert_eq!(done.attempts.len(), 1);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_graceful_stop_releases_held_jobs_and_lets_running_ones_finish() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let gate = Arc::new(Notify::new());
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let mut worker = worker_for(&broker)
        .concurrency(1)
        .prefetch(1)
        .build()
        .unwrap();
    {
        let gate = gate.clone();
        worker.handle("w", move |job: Job| {
            let (gate, started) = (gate.clone(), started_tx.clone());
            async move {
                let _ = started.send(job.text()?.to_string());
                gate.notified().await;
                Ok("finished in the grace")
            }
        });
    }
    let running = Running::start(worker);

    let first = enqueue(&client, job("w", "first")).await;
    let name = tokio::time::timeout(GIVE_UP, started.recv()).await.unwrap();
    assert_eq!(name.as_deref(), Some("first"));
    let held = enqueue(&client, job("w", "held")).await;
    wait_for_state(&client, &held, JobState::Active).await; // leased, waiting for the slot

    running.stop.shutdown();
    let released = wait_for_state(&client, &held, JobState::Ready).await;
    assert!(released.last_error.is_empty());
    assert!(started.try_recv().is_err(), "the held job never starts");
    assert_eq!(
        client.get_job(&first).await.unwrap().state,
        JobState::Active as i32,
        "the running job runs on during the grace"
    );

    gate.notify_one();
    running.finished().await.unwrap();
    assert_eq!(
        client.get_job(&first).await.unwrap().state,
        JobState::Completed as i32,
        "its ack was awaited before run returned"
    );
    assert_eq!(
        client.get_job(&held).await.unwrap().state,
        JobState::Ready as i32
    );
}

#[tokio::test]
async fn at_the_end_of_grace_the_token_fires_and_the_job_is_released() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let mut worker = worker_for(&broker)
        .grace(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut seen = report_cancellation(&mut worker, "w");
    let running = Running::start(worker);
    let id = enqueue(&client, job("w", "x")).await;
    assert_eq!(next_seen(&mut seen).await, Seen::Started);

    running.stop.shutdown();
    assert_eq!(
        next_seen(&mut seen).await,
        Seen::Cancelled(CancelReason::Shutdown)
    );
    running.finished().await.unwrap();
    let released = client.get_job(&id).await.unwrap();
    assert_eq!(released.state, JobState::Ready as i32);
    assert!(released.last_error.is_empty(), "{}", released.last_error);
}

#[tokio::test]
async fn durable_steps_resume_from_the_checkpoint() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let runs = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut worker = worker_for(&broker).build().unwrap();
    {
        let runs = runs.clone();
        worker.handle("w", move |job: Job| {
            let runs = runs.clone();
            async move {
                let mut results = serde_json::Map::new();
                for (i, name) in ["a", "b"].into_iter().enumerate() {
                    let value: Value = job
                        .step(name, async {
                            runs.lock().unwrap().push(name.to_string());
                            Ok(json!({"step": name, "n": i, "half": i as f64 + 0.5}))
                        })
                        .await?;
                    results.insert(name.into(), value);
                }
                if job.attempt() == 1 {
                    return Err(WorkerError::other("crash after the steps"));
                }
                // A name used twice in one attempt is the handler's mistake.
                let twice = job.step("a", async { Ok(0) }).await.unwrap_err();
                assert!(twice.to_string().contains("twice"), "{twice}");
                Ok(Value::Object(results))
            }
        });
    }
    let running = Running::start(worker);
    let id = enqueue(&client, job("w", "{}")).await;
    let done = wait_for_state(&client, &id, JobState::Completed).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(*runs.lock().unwrap(), ["a", "b"], "each body ran once");
    assert_eq!(
        json_of(&done.result),
        json!({
            "a": {"step": "a", "n": 0, "half": 0.5},
            "b": {"step": "b", "n": 1, "half": 1.5},
        })
    );
    // The checkpoint is the cross-language StepCheckpoint, results as JSON.
    let checkpoint = StepCheckpoint::decode(done.checkpoint.as_slice()).unwrap();
    let names: Vec<&str> = checkpoint.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        json_of(&checkpoint.steps[1].result),
        json!({"step": "b", "n": 1, "half": 1.5})
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_checkpoint_not_written_by_steps_fails_the_attempt() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let id = enqueue(
        &client,
        EnqueueRequest {
            max_attempts: 2,
            ..job("w", "{}")
        },
    )
    .await;
    // Attempt 1 saves something else as its checkpoint, then fails.
    let leased = client
        .broker()
        .lease(LeaseRequest {
            queue: "w".into(),
            worker_id: "not-steps".into(),
            max_jobs: 1,
            lease_duration: None,
            wait: Some(duration(GIVE_UP)),
        })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .remove(0);
    client
        .broker()
        .heartbeat(HeartbeatRequest {
            job_id: id.clone(),
            lease_id: leased.lease_id.clone(),
            extend_by: None,
            checkpoint: Some(b"half done".to_vec()),
            progress: None,
        })
        .await
        .unwrap();
    client
        .broker()
        .fail(FailRequest {
            job_id: id.clone(),
            lease_id: leased.lease_id,
            error: "first".into(),
            permanent: false,
            retry_after: None,
        })
        .await
        .unwrap();

    let ran = Arc::new(AtomicUsize::new(0));
    let mut worker = worker_for(&broker).build().unwrap();
    {
        let ran = ran.clone();
        worker.handle("w", move |job: Job| {
            let ran = ran.clone();
            async move {
                let n: i64 = job
                    .step("a", async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok(1)
                    })
                    .await?;
                Ok(n.to_string())
            }
        });
    }
    let running = Running::start(worker);
    let dead = wait_for_state(&client, &id, JobState::Failed).await;
    assert!(
        dead.last_error
            .contains("not a jobbroker.v1.StepCheckpoint"),
        "{}",
        dead.last_error
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "no step ran again");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_newest_progress_always_arrives() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let gate = Arc::new(Notify::new());
    let mut worker = worker_for(&broker).build().unwrap();
    {
        let gate = gate.clone();
        worker.handle("w", move |job: Job| {
            let gate = gate.clone();
            async move {
                for percent in 1..=20 {
                    job.progress(&json!({ "percent": percent }))?;
                }
                gate.notified().await;
                Ok(())
            }
        });
    }
    let running = Running::start(worker);
    let id = enqueue(&client, job("w", "x")).await;
    let give_up = tokio::time::Instant::now() + GIVE_UP;
    loop {
        let progress = client.get_job(&id).await.unwrap().progress;
        if !progress.is_empty() && json_of(&progress) == json!({"percent": 20}) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "progress {progress:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.notify_one();
    wait_for_state(&client, &id, JobState::Completed).await;
    running.stop().await.unwrap();
}

#[tokio::test]
async fn many_quick_jobs_are_all_acked() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let mut worker = worker_for(&broker)
        .concurrency(8)
        .prefetch(8)
        .build()
        .unwrap();
    worker.handle("w", |job: Job| async move { Ok(job.payload().to_vec()) });
    let running = Running::start(worker);
    let ids: Vec<String> = client
        .enqueue_batch((0..300).map(|i| job("w", format!("{i}"))).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.job_id)
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let done = wait_for_state(&client, id, JobState::Completed).await;
        assert_eq!(done.result, format!("{i}").into_bytes());
        assert_eq!(done.attempt, 1);
    }
    running.stop().await.unwrap();
}

#[tokio::test]
async fn an_answer_waits_for_the_broker_to_come_back() {
    let mut broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let gate = Arc::new(Notify::new());
    let (done_tx, mut done) = mpsc::unbounded_channel();
    let mut worker = worker_for(&broker)
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    {
        let gate = gate.clone();
        worker.handle("w", move |job: Job| {
            let (gate, done) = (gate.clone(), done_tx.clone());
            async move {
                if job.text()? == "first" {
                    gate.notified().await;
                }
                let _ = done.send(job.id().to_string());
                Ok("done")
            }
        });
    }
    let running = Running::start(worker);
    let first = enqueue(&client, job("w", "first")).await;
    wait_for_state(&client, &first, JobState::Active).await;

    broker.kill_and_restart();
    // The handler returns while the broker is down: its ack waits for the next stream.
    gate.notify_one();
    assert_eq!(
        tokio::time::timeout(GIVE_UP, done.recv()).await.unwrap(),
        Some(first.clone())
    );
    let client = broker.client().await;
    let completed = wait_for_state(&client, &first, JobState::Completed).await;
    assert_eq!(completed.attempt, 1, "the ack of attempt 1 was resent");
    // And the new stream gets new jobs.
    let after = enqueue(&client, job("w", "after")).await;
    wait_for_state(&client, &after, JobState::Completed).await;
    running.stop().await.unwrap();
}

/// A broker that stops answering (SIGSTOP: to TCP, as a hung broker, a machine without power or
/// a firewall that drops packets) is noticed by no TCP error: the worker's keepalive ping goes
/// unanswered, it closes the connection (its stream ends `UNAVAILABLE`, as a raw `Work` stream
/// of such a client shows) and keeps reconnecting; once the broker runs again the same worker
/// runs the next job.
#[tokio::test]
async fn keepalive_gives_up_a_frozen_broker_and_the_worker_comes_back() {
    let broker = Broker::start();
    let client = broker.client().await;
    let options = ClientOptions::from(broker.addr.as_str())
        .keepalive_time(Duration::from_secs(1))
        .keepalive_timeout(Duration::from_secs(1));
    let (_raw, mut raw_events) = Client::connect(options.clone())
        .await
        .unwrap()
        .work(SubscribeRequest {
            queues: vec!["keepalive-raw".into()],
            worker_id: "rust-keepalive-raw".into(),
            max_in_flight: 1,
            ..Default::default()
        })
        .await
        .expect("subscribe");
    // A short lease: should a job still go to a connection the worker tried while the broker was
    // frozen (one the worker closes just as the broker answers it), it comes back in seconds.
    let mut worker = Worker::builder(options)
        .worker_id("rust-keepalive")
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    worker.handle("keepalive", |job: Job| async move {
        Ok(format!("done: {}", job.text()?))
    });
    let running = Running::start(worker);

    let before = enqueue(&client, job("keepalive", "before")).await;
    let done = wait_for_state(&client, &before, JobState::Completed).await;
    assert_eq!(done.attempts[0].worker_id, "rust-keepalive");
    // The worker's connection: its source port is the port of its peer in ListWorkers.
    let give_up = tokio::time::Instant::now() + GIVE_UP;
    let peer = loop {
        let workers = client.list_workers(Some("keepalive")).await.unwrap();
        if let Some(me) = workers
            .iter()
            .find(|w| w.worker_id == "rust-keepalive" && w.streams > 0)
        {
            break me.peer.clone();
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the worker is not in ListWorkers: {workers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (from, to) = (port_of(&peer), port_of(&broker.addr));
    assert!(
        tcp_established(from, to),
        "no ESTABLISHED connection {from} -> {to} in /proc/net/tcp (peer {peer})"
    );

    let frozen = broker.freeze();
    let frozen_at = tokio::time::Instant::now();
    let give_up = frozen_at + Duration::from_secs(40);
    while tcp_established(from, to) {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the worker kept its connection {from} -> {to} to the frozen broker for 40 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "the worker gave up the frozen broker's connection after {:?}",
        frozen_at.elapsed()
    );
    let raw_end = tokio::time::timeout_at(give_up, async {
        loop {
            match raw_events.recv().await {
                Some(WorkEvent::Closed(end)) => break end,
                Some(_) => continue,
                None => panic!("the raw stream's events ended without Closed"),
            }
        }
    })
    .await
    .expect("the raw Work stream did not end within 40 s of the freeze");
    assert_eq!(
        raw_end.as_ref().map(|status| status.code()),
        Some(Code::Unavailable),
        "{raw_end:?}"
    );
    drop(frozen); // SIGCONT

    // It comes back on its own. The connections it tried while the broker was frozen reach the
    // broker only now, already closed: wait until they are gone and its one stream is on a live
    // connection, so that the job below is not pushed to one of them (the broker would give it
    // back, but a push whose write had already left would wait out its lease).
    let give_up = tokio::time::Instant::now() + GIVE_UP;
    loop {
        let workers = client.list_workers(Some("keepalive")).await.unwrap();
        let me = workers.iter().find(|w| w.worker_id == "rust-keepalive");
        if me.is_some_and(|me| me.streams == 1 && tcp_established(port_of(&me.peer), to)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the worker is not back on one live stream: {workers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A job enqueued now is run by the same worker.
    let after = enqueue(&client, job("keepalive", "after")).await;
    let done = wait_for_state(&client, &after, JobState::Completed).await;
    assert_eq!(done.attempts.last().unwrap().worker_id, "rust-keepalive");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_stream_that_ends_during_a_graceful_stop_is_reopened_for_the_answers() {
    // docs/worker-contract.md §6: a stream that ends before step 6 is reopened as usual, so
    // that the answers still to come reach the broker.
    let mut broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let gate = Arc::new(Notify::new());
    let (started_tx, mut started) = mpsc::unbounded_channel();
    // A grace far beyond the give-up time below: a stop that waited for it would fail the test.
    let grace = GIVE_UP * 10;
    let mut worker = worker_for(&broker)
        .lease(Duration::from_secs(60))
        .grace(grace)
        .build()
        .unwrap();
    {
        let gate = gate.clone();
        worker.handle("w", move |job: Job| {
            let (gate, started) = (gate.clone(), started_tx.clone());
            async move {
                let _ = started.send(job.id().to_string());
                gate.notified().await;
                Ok("finished after the restart")
            }
        });
    }
    let running = Running::start(worker);
    let id = enqueue(&client, job("w", "x")).await;
    let name = tokio::time::timeout(GIVE_UP, started.recv()).await.unwrap();
    assert_eq!(name.as_deref(), Some(id.as_str()));

    running.stop.shutdown();
    // The only stream dies during the grace; the broker comes back on the same data and port.
    broker.kill_and_restart();
    let client = broker.client().await;
    // A job the reopened stream may be pushed (before its flow 0 took effect) is released.
    let later = enqueue(&client, job("w", "later")).await;
    // The handler returns after that: its ack can only go out on a reopened stream.
    gate.notify_one();
    let stopped = tokio::time::timeout(GIVE_UP, running.task)
        .await
        .expect("the stop did not end before its grace: its stream was not reopened");
    stopped.expect("the worker task panicked").unwrap();

    assert!(
        started.try_recv().is_err(),
        "no handler starts during a stop"
    );
    let released = client.get_job(&later).await.unwrap();
    assert_eq!(released.state, JobState::Ready as i32, "{released:?}");
    assert!(released.last_error.is_empty(), "{}", released.last_error);
    let done = client.get_job(&id).await.unwrap();
    assert_eq!(
        done.state,
        JobState::Completed as i32,
        "the ack did not reach the broker: {done:?}"
    );
    assert_eq!(done.attempt, 1);
    assert_eq!(done.result, b"finished after the restart");
}

#[tokio::test]
async fn run_refuses_to_start_without_handlers_or_with_a_bad_queue() {
    let broker = Broker::start();
    let worker = worker_for(&broker).build().unwrap();
    assert!(matches!(worker.run().await, Err(RunError::NoHandlers)));

    let mut worker = worker_for(&broker).build().unwrap();
    worker.handle("bad queue name!", |_job: Job| async move { Ok(()) });
    match tokio::time::timeout(GIVE_UP, worker.run()).await.unwrap() {
        Err(RunError::Refused(status)) => assert_eq!(status.code(), Code::InvalidArgument),
        other => panic!("want Refused(InvalidArgument), got {other:?}"),
    }
}

#[tokio::test]
async fn a_handler_that_ignores_its_time_out_keeps_its_slot_until_it_returns() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut worker = worker_for(&broker)
        .concurrency(1)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    {
        let order = order.clone();
        worker.handle("w", move |job: Job| {
            let order = order.clone();
            async move {
                let name = format!("{}#{}", job.text()?, job.attempt());
                order.lock().unwrap().push(format!("start {name}"));
                if name == "stuck#1" {
                    // Never looks at its token, which fires at the 300 ms time-out.
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    assert_eq!(job.cancel_reason(), Some(CancelReason::TimedOut));
                }
                order.lock().unwrap().push(format!("end {name}"));
                Ok(())
            }
        });
    }
    let running = Running::start(worker);
    let stuck = enqueue(
        &client,
        EnqueueRequest {
            timeout: Some(duration(Duration::from_millis(300))),
            ..job("w", "stuck")
        },
    )
    .await;
    wait_for_state(&client, &stuck, JobState::Active).await;
    let after = enqueue(&client, job("w", "after")).await;
    wait_for_state(&client, &after, JobState::Completed).await;
    let done = wait_for_state(&client, &stuck, JobState::Completed).await;
    assert_eq!(done.attempts[0].outcome, AttemptOutcome::TimedOut as i32);

    let order = order.lock().unwrap().clone();
    let stuck_end = order.iter().position(|e| e == "end stuck#1");
    let after_start = order.iter().position(|e| e == "start after#1");
    assert!(
        stuck_end.is_some() && after_start > stuck_end,
        "a second handler ran beside the stuck one (concurrency 1): {order:?}"
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_stop_gives_up_on_a_handler_that_ignores_the_end_of_grace() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let mut worker = worker_for(&broker)
        .grace(Duration::from_millis(100))
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    worker.handle("w", move |_job: Job| {
        let started = started_tx.clone();
        async move {
            let _ = started.send(());
            tokio::time::sleep(GIVE_UP * 10).await;
            Ok("never")
        }
    });
    let running = Running::start(worker);
    let id = enqueue(&client, job("w", "x")).await;
    tokio::time::timeout(GIVE_UP, started.recv()).await.unwrap();
    running.stop().await.unwrap();
    let released = client.get_job(&id).await.unwrap();
    assert_eq!(released.state, JobState::Ready as i32);
    assert!(released.last_error.is_empty(), "{}", released.last_error);
}

#[tokio::test]
async fn a_worker_presents_its_bearer_token() {
    let tokens = common::TempDir::new("tokens");
    let file = tokens.0.join("tokens.json");
    std::fs::write(
        &file,
        r#"{"tokens": [{"name": "test", "token": "s3cret-token", "roles": ["producer", "worker", "admin"], "queues": ["*"]}]}"#,
    )
    .unwrap();
    let broker = Broker::start_with_args(Some(CONFIG), &["--auth-tokens", file.to_str().unwrap()]);
    let client = broker.client().await.with_token("s3cret-token").unwrap();

    // Without the token the broker refuses the stream: retrying would not help.
    let mut anonymous = worker_for(&broker).build().unwrap();
    anonymous.handle("w", |_job: Job| async move { Ok(()) });
    match tokio::time::timeout(GIVE_UP, anonymous.run())
        .await
        .unwrap()
    {
        Err(RunError::Refused(status)) => assert_eq!(status.code(), Code::Unauthenticated),
        other => panic!("want Refused(Unauthenticated), got {other:?}"),
    }

    let mut worker = worker_for(&broker).token("s3cret-token").build().unwrap();
    worker.handle("w", |_job: Job| async move { Ok("with a token") });
    let running = Running::start(worker);
    let id = enqueue(&client, job("w", "x")).await;
    let done = wait_for_state(&client, &id, JobState::Completed).await;
    assert_eq!(done.result, b"with a token");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn middleware_wraps_each_handler_call_first_registered_outermost() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut worker = worker_for(&broker).build().unwrap();
    for name in ["outer", "inner"] {
        let order = order.clone();
        worker.use_middleware(move |job: Job, next: jobbroker::HandlerNext| {
            let order = order.clone();
            async move {
                order.lock().unwrap().push(format!("{name} before"));
                // The inner one answers a "skip" job itself: the handler never runs.
                if name == "inner" && job.text()? == "skip" {
                    return Ok(jobbroker::Output::from("answered by middleware"));
                }
                let outcome = next.run(job).await;
                order.lock().unwrap().push(format!("{name} after"));
                outcome
            }
        });
    }
    let handled = order.clone();
    worker.handle("w", move |_job: Job| {
        let handled = handled.clone();
        async move {
            handled.lock().unwrap().push("handler".into());
            Ok("from the handler")
        }
    });
    let running = Running::start(worker);

    let id = enqueue(&client, job("w", "run")).await;
    let done = wait_for_state(&client, &id, JobState::Completed).await;
    assert_eq!(done.result, b"from the handler");
    assert_eq!(
        *order.lock().unwrap(),
        [
            "outer before",
            "inner before",
            "handler",
            "inner after",
            "outer after"
        ]
    );

    order.lock().unwrap().clear();
    let id = enqueue(&client, job("w", "skip")).await;
    let done = wait_for_state(&client, &id, JobState::Completed).await;
    assert_eq!(done.result, b"answered by middleware");
    assert_eq!(
        *order.lock().unwrap(),
        ["outer before", "inner before", "outer after"]
    );
    running.stop().await.unwrap();
}
