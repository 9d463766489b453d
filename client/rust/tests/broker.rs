//! Integration tests of the Rust client against the real broker binary.

mod common;

use std::time::Duration;

use common::{Broker, FAST_RETRIES, GIVE_UP, wait_for_state};
use jobbroker::v1::{
    AckRequest, AttemptOutcome, FailReason, FailRequest, HeartbeatRequest, JobState, LeaseRequest,
    LeasedJob, ReleaseRequest, SubscribeRequest,
};
use jobbroker::{Client, Code, WorkEvent, duration, job};

/// Unary long-poll lease of one job; panics if none arrives before GIVE_UP.
async fn lease_one(client: &Client, queue: &str) -> LeasedJob {
    let response = client
        .broker()
        .lease(LeaseRequest {
            queue: queue.into(),
            worker_id: "rust-test".into(),
            max_jobs: 1,
            lease_duration: None,
            wait: Some(duration(GIVE_UP)),
        })
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(response.jobs.len(), 1, "no job leased from {queue}");
    response.jobs.into_iter().next().unwrap()
}

/// The next job pushed on a Work stream (skipping nothing else: a notice here is a failure).
async fn next_job(events: &mut tokio::sync::mpsc::UnboundedReceiver<WorkEvent>) -> LeasedJob {
    match tokio::time::timeout(GIVE_UP, events.recv()).await {
        Ok(Some(WorkEvent::Job(job))) => job,
        other => panic!("expected a pushed job, got {other:?}"),
    }
}

#[tokio::test]
async fn enqueue_lease_heartbeat_ack() {
    let broker = Broker::start();
    let client = broker.client().await;

    let mut request = job("emails", b"hello".to_vec());
    request.headers.insert("trace".into(), "t-1".into());
    let enqueued = client.enqueue(request).await.unwrap();
    assert!(!enqueued.job_id.is_empty());
    assert!(!enqueued.deduplicated);
    assert_eq!(
        client.get_job(&enqueued.job_id).await.unwrap().state,
        JobState::Ready as i32
    );

    let leased = lease_one(&client, "emails").await;
    assert_eq!(leased.job_id, enqueued.job_id);
    assert_eq!(leased.payload, b"hello");
    assert_eq!(leased.headers.get("trace").map(String::as_str), Some("t-1"));
    assert_eq!(leased.attempt, 1);
    assert_eq!(leased.idempotency_key, enqueued.job_id);
    assert_eq!(
        client.get_job(&leased.job_id).await.unwrap().state,
        JobState::Active as i32
    );

    let heartbeat = client
        .broker()
        .heartbeat(HeartbeatRequest {
            job_id: leased.job_id.clone(),
            lease_id: leased.lease_id.clone(),
            extend_by: Some(duration(Duration::from_secs(60))),
            checkpoint: Some(b"half done".to_vec()),
            progress: Some(br#"{"percent":50}"#.to_vec()),
        })
        .await
        .unwrap()
        .into_inner();
    let new_deadline = heartbeat
        .lease_deadline
        .expect("heartbeat returns a deadline");
    let old_deadline = leased.lease_deadline.unwrap();
    assert!(new_deadline.seconds >= old_deadline.seconds);
    assert!(!heartbeat.cancel_requested);
    let running = client.get_job(&leased.job_id).await.unwrap();
    assert_eq!(running.progress, br#"{"percent":50}"#.to_vec());

    client
        .broker()
        .ack(AckRequest {
            job_id: leased.job_id.clone(),
            lease_id: leased.lease_id.clone(),
            result: b"sent".to_vec(),
        })
        .await
        .unwrap();
    let done = client.get_job(&leased.job_id).await.unwrap();
    assert_eq!(done.state, JobState::Completed as i32);
    assert_eq!(done.attempt, 1);
    assert_eq!(done.result, b"sent");
    assert_eq!(done.checkpoint, b"half done");
    assert_eq!(done.attempts.len(), 1);
    assert_eq!(done.attempts[0].outcome, AttemptOutcome::Completed as i32);
}

#[tokio::test]
async fn work_stream_pushes_heartbeats_and_acks() {
    let broker = Broker::start();
    let client = broker.client().await;

    let (work, mut events) = client
        .work(SubscribeRequest {
            queues: vec!["stream".into()],
            worker_id: "rust-stream".into(),
            max_in_flight: 1,
            lease_duration: Some(duration(Duration::from_secs(30))),
            ..Default::default()
        })
        .await
        .expect("subscribe");

    // Enqueued after subscribing: the broker pushes it without being asked.
    let enqueued = client
        .enqueue(job("stream", b"pushed".to_vec()))
        .await
        .unwrap();
    let pushed = next_job(&mut events).await;
    assert_eq!(pushed.job_id, enqueued.job_id);
    assert_eq!(pushed.payload, b"pushed");
    assert_eq!(pushed.attempt, 1);

    let beat = work
        .heartbeat(&pushed, Some(b"cp".to_vec()))
        .await
        .expect("heartbeat");
    assert!(beat.lease_deadline.is_some());
    assert!(!beat.cancel_requested);

    work.ack(&pushed, b"ok".to_vec()).await.expect("ack");
    let done = client.get_job(&pushed.job_id).await.unwrap();
    assert_eq!(done.state, JobState::Completed as i32);
    assert_eq!(done.checkpoint, b"cp");
    assert_eq!(done.result, b"ok");

    // A stale lease is refused on the stream with its code.
    let stale = work.heartbeat(&pushed, None).await.unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");

    // Drain, then close: the broker ends the stream cleanly.
    work.flow(0).await.expect("flow 0");
    work.close();
    match tokio::time::timeout(GIVE_UP, events.recv()).await {
        Ok(Some(WorkEvent::Closed(end))) => assert!(end.is_none(), "stream ended with {end:?}"),
        Ok(Some(other)) => panic!("unexpected event after drain: {other:?}"),
        Ok(None) => panic!("events ended without Closed"),
        Err(_) => panic!("stream did not end after close"),
    }
}

#[tokio::test]
async fn work_stream_fail_is_retried_as_attempt_two() {
    let broker = Broker::start_with_config(Some(FAST_RETRIES));
    let client = broker.client().await;
    let (work, mut events) = client
        .work(SubscribeRequest {
            queues: vec!["retries".into()],
            worker_id: "rust-retry".into(),
            max_in_flight: 1,
            lease_duration: None,
            ..Default::default()
        })
        .await
        .expect("subscribe");
    let enqueued = client
        .enqueue(job("retries", b"flaky".to_vec()))
        .await
        .unwrap();

    let first = next_job(&mut events).await;
    assert_eq!(first.job_id, enqueued.job_id);
    assert_eq!(first.attempt, 1);
    assert_eq!(first.max_attempts, 3);
    work.fail(&first, "provider timed out", false, None)
        .await
        .expect("fail");

    let second = next_job(&mut events).await;
    assert_eq!(second.job_id, enqueued.job_id);
    assert_eq!(second.attempt, 2);
    assert_ne!(second.lease_id, first.lease_id);
    work.ack(&second, Vec::new()).await.expect("ack");

    let done = client.get_job(&enqueued.job_id).await.unwrap();
    assert_eq!(done.state, JobState::Completed as i32);
    assert_eq!(done.attempt, 2);
    assert_eq!(done.attempts[0].outcome, AttemptOutcome::Error as i32);
    assert_eq!(done.attempts[0].error, "provider timed out");
    assert_eq!(done.attempts[1].outcome, AttemptOutcome::Completed as i32);
}

#[tokio::test]
async fn unary_fail_schedules_a_retry() {
    let broker = Broker::start_with_config(Some(FAST_RETRIES));
    let client = broker.client().await;
    let enqueued = client.enqueue(job("retries", b"x".to_vec())).await.unwrap();

    let first = lease_one(&client, "retries").await;
    assert_eq!(first.attempt, 1);
    let failed = client
        .broker()
        .fail(FailRequest {
            job_id: first.job_id.clone(),
            lease_id: first.lease_id.clone(),
            error: "boom".into(),
            permanent: false,
            retry_after: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(failed.state, JobState::Scheduled as i32);
    assert!(failed.next_attempt_at.is_some());

    let second = lease_one(&client, "retries").await;
    assert_eq!(second.job_id, enqueued.job_id);
    assert_eq!(second.attempt, 2);
    // The first lease is fenced off now.
    let stale = client
        .broker()
        .ack(AckRequest {
            job_id: first.job_id.clone(),
            lease_id: first.lease_id.clone(),
            result: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    client
        .broker()
        .ack(AckRequest {
            job_id: second.job_id.clone(),
            lease_id: second.lease_id.clone(),
            result: Vec::new(),
        })
        .await
        .unwrap();
    wait_for_state(&client, &enqueued.job_id, JobState::Completed).await;
}

#[tokio::test]
async fn permanent_fail_kills_the_job_after_one_attempt() {
    let broker = Broker::start_with_config(Some(FAST_RETRIES));
    let client = broker.client().await;
    let enqueued = client
        .enqueue(job("retries", b"poison".to_vec()))
        .await
        .unwrap();

    let leased = lease_one(&client, "retries").await;
    let failed = client
        .broker()
        .fail(FailRequest {
            job_id: leased.job_id.clone(),
            lease_id: leased.lease_id.clone(),
            error: "malformed payload".into(),
            permanent: true,
            retry_after: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(failed.state, JobState::Failed as i32);

    let dead = client.get_job(&enqueued.job_id).await.unwrap();
    assert_eq!(dead.state, JobState::Failed as i32);
    assert_eq!(dead.fail_reason, FailReason::Permanent as i32);
    assert_eq!(dead.attempt, 1);
    assert_eq!(dead.last_error, "malformed payload");
    assert_eq!(
        dead.attempts[0].outcome,
        AttemptOutcome::PermanentError as i32
    );
}

#[tokio::test]
async fn dedup_key_returns_the_same_job() {
    let broker = Broker::start();
    let client = broker.client().await;
    let request = jobbroker::v1::EnqueueRequest {
        dedup_key: "welcome:user_7".into(),
        ..job("signups", b"user_7".to_vec())
    };
    let first = client.enqueue(request.clone()).await.unwrap();
    let second = client.enqueue(request.clone()).await.unwrap();
    assert!(!first.deduplicated);
    assert!(second.deduplicated);
    assert_eq!(second.job_id, first.job_id);

    // The same key with another payload is a caller bug.
    let conflict = client
        .enqueue(jobbroker::v1::EnqueueRequest {
            payload: b"someone else".to_vec(),
            ..request
        })
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists, "{conflict:?}");
    assert_eq!(
        client.get_job(&first.job_id).await.unwrap().idempotency_key,
        "welcome:user_7"
    );
}

#[tokio::test]
async fn batch_enqueue_and_release() {
    let broker = Broker::start();
    let client = broker.client().await;
    let results = client
        .enqueue_batch(vec![
            job("batch", b"1".to_vec()),
            job("batch", b"2".to_vec()),
        ])
        .await
        .unwrap();
    assert_eq!(results.len(), 2);
    assert_ne!(results[0].job_id, results[1].job_id);

    let leased = lease_one(&client, "batch").await;
    assert_eq!(leased.job_id, results[0].job_id);
    client
        .broker()
        .release(ReleaseRequest {
            job_id: leased.job_id.clone(),
            lease_id: leased.lease_id.clone(),
            delay: None,
        })
        .await
        .unwrap();
    let released = client.get_job(&leased.job_id).await.unwrap();
    assert_eq!(released.state, JobState::Ready as i32);
}

#[tokio::test]
async fn invalid_argument_is_a_status_with_its_code() {
    let broker = Broker::start();
    let client = broker.client().await;

    let status = client.enqueue(job("", b"x".to_vec())).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("queue"),
        "message: {}",
        status.message()
    );

    let status = client
        .enqueue(job("bad queue name!", b"x".to_vec()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    // A refused subscription is returned by work() with the broker's code.
    let refused = client
        .work(SubscribeRequest {
            queues: vec![],
            worker_id: "rust-test".into(),
            max_in_flight: 1,
            lease_duration: None,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    let missing = client
        .get_job("01ARZ3NDEKTSV4RRFFQ69G5FAV")
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn broker_stops_cleanly_on_sigterm() {
    let broker = Broker::start();
    let client = broker.client().await;
    client.enqueue(job("q", b"x".to_vec())).await.unwrap();
    drop(client);
    assert_eq!(broker.stop(), Some(0));
}
