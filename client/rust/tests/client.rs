//! The `Client` against the real broker: its options (TLS, mutual TLS, token, several
//! addresses, deadline), the rule of safe retries, `enqueue_and_wait`, and a method for every
//! Admin call.

mod common;

use std::time::Duration;

use common::{
    Broker, Certificates, GIVE_UP, Running, UnavailableNode, stopped_address, wait_for_state,
};
use jobbroker::v1::{
    JobState, ListJobsRequest, QueuePolicy, RetryJobRequest, Schedule, UpdateQueuePolicyRequest,
};
use jobbroker::{
    CLIENT_NAME, Client, ClientOptions, Code, DEFAULT_DEADLINE, Job, RunError, WaitError, Worker,
    WorkerError, duration, job,
};

const ENQUEUE: &str = "/jobbroker.v1.Broker/Enqueue";
const ENQUEUE_BATCH: &str = "/jobbroker.v1.Broker/EnqueueBatch";
const ACK: &str = "/jobbroker.v1.Broker/Ack";
const LEASE: &str = "/jobbroker.v1.Broker/Lease";
const GET_JOB: &str = "/jobbroker.v1.Admin/GetJob";
const CANCEL_JOB: &str = "/jobbroker.v1.Admin/CancelJob";

#[tokio::test]
async fn only_calls_that_cannot_duplicate_are_sent_again_after_unavailable() {
    let node = UnavailableNode::start().await;
    let client = Client::new(node.addr.as_str()).unwrap();
    let unavailable = |result: Result<_, jobbroker::Status>| {
        assert_eq!(result.err().map(|s| s.code()), Some(Code::Unavailable));
    };

    // An enqueue without a dedup key could create the job twice: the caller sees the error.
    unavailable(client.enqueue(job("q", "no key")).await.map(|_| ()));
    assert_eq!(node.calls_of(ENQUEUE), 1);
    // With one, a repeat finds the job the first attempt made: 3 attempts.
    unavailable(
        client
            .enqueue(job("q", "keyed").with_dedup_key("k1"))
            .await
            .map(|_| ()),
    );
    assert_eq!(node.calls_of(ENQUEUE), 1 + 3);

    // A batch is repeated only when every job has a key.
    let mixed = vec![job("q", "a").with_dedup_key("a"), job("q", "b")];
    unavailable(client.enqueue_batch(mixed).await.map(|_| ()));
    assert_eq!(node.calls_of(ENQUEUE_BATCH), 1);
    let keyed = vec![
        job("q", "a").with_dedup_key("a"),
        job("q", "b").with_dedup_key("b"),
    ];
    unavailable(client.enqueue_batch(keyed).await.map(|_| ()));
    assert_eq!(node.calls_of(ENQUEUE_BATCH), 1 + 3);

    // Reads and answers about a lease are repeated; a lease or a cancel is not.
    unavailable(client.get_job("some-id").await.map(|_| ()));
    assert_eq!(node.calls_of(GET_JOB), 3);
    let leased = jobbroker::v1::LeasedJob {
        job_id: "j".into(),
        lease_id: "l".into(),
        ..Default::default()
    };
    unavailable(client.ack(&leased, Vec::new()).await);
    assert_eq!(node.calls_of(ACK), 3);
    unavailable(
        client
            .lease("q", "w", 1, None, Duration::ZERO)
            .await
            .map(|_| ()),
    );
    assert_eq!(node.calls_of(LEASE), 1);
    unavailable(client.cancel_job("some-id").await.map(|_| ()));
    assert_eq!(node.calls_of(CANCEL_JOB), 1);
}

#[tokio::test]
async fn an_enqueue_without_a_key_against_a_stopped_broker_is_attempted_once() {
    // Two brokers outside a cluster: the client uses the first until it fails.
    let first = Broker::start();
    let second = Broker::start();
    let observer = second.client().await;
    let options = || ClientOptions::new().addresses([first.addr.as_str(), second.addr.as_str()]);
    let unkeyed = Client::new(options()).unwrap();
    let keyed = Client::new(options()).unwrap();
    for client in [&unkeyed, &keyed] {
        client.list_queues().await.unwrap();
        assert_eq!(client.current_address(), first.addr);
    }
    drop(first); // SIGKILL

    // The stopped node refuses the connection; the live one next in line is not tried for
    // this call, so the job exists nowhere.
    let refused = unkeyed.enqueue(job("once", "x")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert_eq!(
        observer.get_queue("once").await.err().map(|s| s.code()),
        Some(Code::NotFound),
        "the enqueue must not have reached the live node"
    );
    // The failure moved the client on: the next call goes to the live node.
    assert_eq!(unkeyed.current_address(), second.addr);
    let sent = unkeyed.enqueue(job("once", "y")).await.unwrap();
    assert!(!sent.job_id.is_empty());

    // With a dedup key the same enqueue is repeated on the next node, and lands.
    let sent = keyed
        .enqueue(job("once", "z").with_dedup_key("z"))
        .await
        .unwrap();
    let stored = observer.get_job(&sent.job_id).await.unwrap();
    assert_eq!(stored.payload, b"z");
}

#[tokio::test]
async fn a_unary_call_ends_at_its_deadline() {
    // A node that takes the connection and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in listener.incoming() {
            held.push(connection);
        }
    });
    let client = Client::new(addr.as_str()).unwrap();
    assert_eq!(client.deadline(), DEFAULT_DEADLINE);
    let hurried = client.with_deadline(Duration::from_millis(200));
    let status = hurried.get_job("x").await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    // The override is for the calls of the copy only.
    assert_eq!(client.deadline(), DEFAULT_DEADLINE);

    let options = ClientOptions::new()
        .address(addr.as_str())
        .deadline(Duration::from_millis(200));
    let status = Client::new(options)
        .unwrap()
        .list_queues()
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
}

/// The auth-tokens file: one token for everything this test does, plaintext (development form).
fn tokens_file(dir: &common::TempDir, token: &str) -> String {
    let file = dir.0.join("tokens.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"tokens": [{{"name": "tester", "token": "{token}", "roles": ["producer", "worker", "admin"], "queues": ["*"]}}]}}"#
        ),
    )
    .unwrap();
    file.display().to_string()
}

#[tokio::test]
async fn tls_mutual_tls_and_a_token_from_the_options_reach_a_secured_broker() {
    let certificates = Certificates::make();
    let tokens = tokens_file(&certificates.dir, "right-token");
    let mut args = certificates.broker_args();
    args.extend(["--auth-tokens".to_string(), tokens]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let broker = Broker::start_with_args(None, &args);

    let options = |token: &str| {
        ClientOptions::new()
            .address(broker.addr.as_str())
            .tls_ca_file(certificates.path("ca.pem"))
            .client_cert_files(
                certificates.path("client.pem"),
                certificates.path("client.key"),
            )
            .token(token)
    };
    let client = Client::connect(options("right-token")).await.unwrap();

    let mut worker = Worker::builder(options("right-token"))
        .worker_id("tls-worker")
        .build()
        .unwrap();
    worker.handle("secure", |job: Job| async move {
        Ok(format!("{} over TLS", job.text()?))
    });
    let running = Running::start(worker);
    let done = client
        .enqueue_and_wait(job("secure", "done"), Some(GIVE_UP))
        .await
        .unwrap();
    assert_eq!(done.result, b"done over TLS");
    let workers = client.list_workers(Some("secure")).await.unwrap();
    let seen = workers
        .iter()
        .find(|w| w.worker_id == "tls-worker")
        .expect("ListWorkers shows the worker");
    assert_eq!(seen.client, CLIENT_NAME);
    running.stop().await.unwrap();

    // A wrong token: every call is refused, and a worker's run ends at once with the refusal.
    let wrong = Client::new(options("wrong-token")).unwrap();
    let status = wrong.enqueue(job("secure", "x")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    let mut refused = Worker::builder(options("wrong-token")).build().unwrap();
    refused.handle("secure", |_job: Job| async move {
        Err::<(), _>(WorkerError::permanent("never runs"))
    });
    match tokio::time::timeout(GIVE_UP, refused.run()).await.unwrap() {
        Err(RunError::Refused(status)) => assert_eq!(status.code(), Code::Unauthenticated),
        other => panic!("want Refused(Unauthenticated), got {other:?}"),
    }

    // Without a client certificate the broker ends the handshake; without TLS it does not
    // speak at all.
    let no_cert = ClientOptions::new()
        .address(broker.addr.as_str())
        .tls_ca_file(certificates.path("ca.pem"))
        .token("right-token")
        .deadline(Duration::from_secs(5));
    assert!(Client::new(no_cert).unwrap().list_queues().await.is_err());
    let plaintext = ClientOptions::new()
        .address(broker.addr.as_str())
        .token("right-token")
        .deadline(Duration::from_secs(5));
    assert!(Client::new(plaintext).unwrap().list_queues().await.is_err());
}

#[tokio::test]
async fn enqueue_and_wait_returns_the_completed_job_or_names_how_it_ended() {
    let broker = Broker::start();
    let client = broker.client().await;
    let mut worker = Worker::builder(broker.addr.as_str()).build().unwrap();
    worker.handle("wait", |job: Job| async move {
        match job.text()? {
            "bad" => Err(WorkerError::permanent("bad input")),
            "hang" => {
                job.cancelled().await;
                Err(WorkerError::Cancelled)
            }
            text => Ok(format!("did {text}")),
        }
    });
    let running = Running::start(worker);

    let done = client
        .enqueue_and_wait(job("wait", "it"), Some(GIVE_UP))
        .await
        .unwrap();
    assert_eq!(done.state(), JobState::Completed);
    assert_eq!(done.result, b"did it");

    let failed = client
        .enqueue_and_wait(job("wait", "bad"), Some(GIVE_UP))
        .await
        .unwrap_err();
    let message = failed.to_string();
    assert!(
        message.contains("JOB_STATE_FAILED") && message.contains("bad input"),
        "{message}"
    );
    assert_eq!(failed.job().unwrap().state(), JobState::Failed);

    // Cancelled while it runs: the wait ends naming CANCELLED.
    let sent = client.enqueue(job("wait", "hang")).await.unwrap();
    wait_for_state(&client, &sent.job_id, JobState::Active).await;
    let waiting = {
        let client = client.clone();
        let id = sent.job_id.clone();
        tokio::spawn(async move { client.wait_for_job(&id, Some(GIVE_UP)).await })
    };
    client.cancel_job(&sent.job_id).await.unwrap();
    let cancelled = waiting.await.unwrap().unwrap_err();
    assert!(
        cancelled.to_string().contains("JOB_STATE_CANCELLED"),
        "{cancelled}"
    );

    // Nobody works this queue: the time given runs out, and the job goes on.
    let timed_out = client
        .enqueue_and_wait(job("nobody", "x"), Some(Duration::from_millis(300)))
        .await
        .unwrap_err();
    let WaitError::Timeout { job_id, .. } = timed_out else {
        panic!("want a timeout, got {timed_out}");
    };
    assert_eq!(
        client.get_job(&job_id).await.unwrap().state(),
        JobState::Ready
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_schedule_round_trip() {
    let broker = Broker::start();
    let client = broker.client().await;
    let schedule = Schedule {
        schedule_id: "nightly-report".into(),
        every: Some(duration(Duration::from_secs(3600))),
        template: Some(job("reports", r#"{"kind":"nightly"}"#).with_priority(2)),
        ..Default::default()
    };
    let stored = client.put_schedule(schedule).await.unwrap();
    assert!(stored.next_run_at.is_some());
    assert!(stored.created_at.is_some());

    let read = client.get_schedule("nightly-report").await.unwrap();
    assert_eq!(read.every, Some(duration(Duration::from_secs(3600))));
    assert_eq!(read.template.as_ref().unwrap().queue, "reports");
    let listed = client.list_schedules(Some("reports")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        client
            .list_schedules(Some("other"))
            .await
            .unwrap()
            .is_empty()
    );

    let triggered = client.trigger_schedule("nightly-report").await.unwrap();
    let run = client.get_job(&triggered.job_id).await.unwrap();
    assert_eq!(run.queue, "reports");
    assert_eq!(run.priority, 2);
    assert!(
        run.dedup_key.starts_with("nightly-report@"),
        "{}",
        run.dedup_key
    );

    client.delete_schedule("nightly-report").await.unwrap();
    let gone = client.get_schedule("nightly-report").await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    // The job the run enqueued stays.
    client.get_job(&triggered.job_id).await.unwrap();
}

#[tokio::test]
async fn list_workers_shows_who_is_connected_and_what_runs() {
    let broker = Broker::start();
    let client = broker.client().await;
    let mut worker = Worker::builder(broker.addr.as_str())
        .worker_id("lister")
        .grace(Duration::from_millis(100))
        .build()
        .unwrap();
    worker.handle("listed", |job: Job| async move {
        job.cancelled().await;
        Err::<(), _>(WorkerError::Cancelled)
    });
    let running = Running::start(worker);
    let sent = client.enqueue(job("listed", "x")).await.unwrap();
    wait_for_state(&client, &sent.job_id, JobState::Active).await;

    let workers = client.list_workers(None).await.unwrap();
    let lister = workers.iter().find(|w| w.worker_id == "lister").unwrap();
    assert_eq!(lister.queues, ["listed"]);
    assert_eq!(lister.streams, 1);
    assert_eq!(lister.client, CLIENT_NAME);
    assert_eq!(lister.in_flight, [sent.job_id.as_str()]);
    assert!(
        client
            .list_workers(Some("elsewhere"))
            .await
            .unwrap()
            .is_empty()
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn admin_calls_on_jobs_queues_and_the_cluster() {
    let broker = Broker::start();
    let client = broker.client().await;

    // Jobs: list, cancel, retry, delete; a dependency waits.
    let first = client.enqueue(job("admin", "1")).await.unwrap().job_id;
    let second = client
        .enqueue(job("admin", "2").with_depends_on(first.clone()))
        .await
        .unwrap()
        .job_id;
    assert_eq!(
        client.get_job(&second).await.unwrap().state(),
        JobState::Waiting
    );
    let page = client
        .list_jobs(ListJobsRequest {
            queue: "admin".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = page.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, [first.as_str(), second.as_str()]);

    let cancelled = client.cancel_job(&first).await.unwrap();
    assert_eq!(cancelled.state(), JobState::Cancelled);
    // Its dependent fails with it.
    wait_for_state(&client, &second, JobState::Failed).await;
    let retried = client.retry_job(&first).await.unwrap();
    assert_eq!(retried.state(), JobState::Ready);
    let counted = client
        .retry_jobs(RetryJobRequest {
            queue: "admin".into(),
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(counted.matched, 1, "the dependent is the one FAILED job");
    client.delete_job(&second).await.unwrap();
    assert_eq!(
        client.get_job(&second).await.unwrap_err().code(),
        Code::NotFound
    );

    // Queues: list, get, policy, pause, resume, purge.
    let names: Vec<String> = client
        .list_queues()
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert!(names.contains(&"admin".to_string()), "{names:?}");
    let info = client.get_queue("admin").await.unwrap();
    assert_eq!(info.counts.get("JOB_STATE_READY"), Some(&1));
    let updated = client
        .update_queue_policy(UpdateQueuePolicyRequest {
            queue: "admin".into(),
            policy: Some(QueuePolicy {
                max_concurrency: Some(3),
                ..Default::default()
            }),
            reset: false,
        })
        .await
        .unwrap();
    assert_eq!(updated.policy.unwrap().max_concurrency, Some(3));
    let paused = client.pause_queue("admin").await.unwrap();
    assert_eq!(paused.policy.unwrap().paused, Some(true));
    let resumed = client.resume_queue("admin").await.unwrap();
    assert_eq!(resumed.policy.unwrap().paused, Some(false));
    client.cancel_job(&first).await.unwrap();
    assert_eq!(client.purge_queue("admin", &[]).await.unwrap(), 1);
    assert_eq!(
        client.get_job(&first).await.unwrap_err().code(),
        Code::NotFound
    );

    // The cluster: a single node answers as a cluster of one.
    let cluster = client.get_cluster().await.unwrap();
    assert!(cluster.partition_count >= 1);
    assert!(
        cluster
            .partitions
            .iter()
            .all(|p| !p.leader_address.is_empty())
    );
}

#[tokio::test]
async fn a_worker_moves_on_to_the_next_address() {
    let broker = Broker::start();
    let client = broker.client().await;
    let options = ClientOptions::new().addresses([stopped_address(), broker.addr.clone()]);
    let mut worker = Worker::builder(options).build().unwrap();
    worker.handle(
        "failover",
        |_job: Job| async move { Ok("found the live node") },
    );
    let running = Running::start(worker);
    let done = client
        .enqueue_and_wait(job("failover", "x"), Some(GIVE_UP))
        .await
        .unwrap();
    assert_eq!(done.result, b"found the live node");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn producer_middleware_wraps_enqueue_and_may_add_headers() {
    let broker = Broker::start();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut client = broker.client().await;
    for name in ["outer", "inner"] {
        let order = order.clone();
        client = client.with_producer_middleware(move |mut request, next| {
            let order = order.clone();
            async move {
                order.lock().unwrap().push(format!("{name} before"));
                request.headers.insert(name.into(), "seen".into());
                let answer = next.run(request).await;
                order.lock().unwrap().push(format!("{name} after"));
                answer
            }
        });
    }
    let sent = client.enqueue(job("mw", "x")).await.unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        ["outer before", "inner before", "inner after", "outer after"]
    );
    let stored = client.get_job(&sent.job_id).await.unwrap();
    assert_eq!(
        stored.headers.get("outer").map(String::as_str),
        Some("seen")
    );
    assert_eq!(
        stored.headers.get("inner").map(String::as_str),
        Some("seen")
    );

    // Each job of a batch goes through the chain before the batch is sent whole.
    let sent = client
        .enqueue_batch(vec![job("mw", "a"), job("mw", "b")])
        .await
        .unwrap();
    for result in sent {
        let stored = client.get_job(&result.job_id).await.unwrap();
        assert_eq!(
            stored.headers.get("inner").map(String::as_str),
            Some("seen")
        );
    }
}
