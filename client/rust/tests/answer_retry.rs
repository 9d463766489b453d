//! The worker contract's rules for a cluster between leaders (docs/worker-contract.md §4, §5),
//! against a stand-in node (tests/common FakeWorkNode) that answers what the real broker
//! answers only while a partition has no leader:
//! * an ack answered `UNAVAILABLE` (the whole message, or its item of an `ack_batch`) is not
//!   final: it is sent again after 250 ms;
//! * a subscription answered `UNAVAILABLE` on a stream that stays open is a stream that ended:
//!   the worker ends it itself and reconnects; a code retrying would not change ends `run`;
//! * while a group of queues goes to any node (their partition had no leader in the table), the
//!   worker fetches the table again after each backoff delay, and moves those queues to the
//!   leader's own stream once the table names one (the relaying stream would never end by
//!   itself).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use common::{FakeWorkNode, Running, Seen, work_result};
use jobbroker::v1::{self, work_request::Request, work_response::Response};
use jobbroker::{RunError, Worker, WorkerError};

const UNAVAILABLE: i32 = 14;
const INVALID_ARGUMENT: i32 = 3;

fn leased(id: &str) -> Response {
    Response::Job(v1::LeasedJob {
        job_id: id.into(),
        lease_id: format!("lease-{id}"),
        queue: "q".into(),
        payload: id.as_bytes().to_vec(),
        attempt: 1,
        max_attempts: 3,
        // A long lease: no heartbeat during the test.
        lease_deadline: Some(jobbroker::timestamp(
            SystemTime::now() + Duration::from_secs(120),
        )),
        ..Default::default()
    })
}

fn now(response: Response) -> (Duration, Response) {
    (Duration::ZERO, response)
}

/// The times the node got an ack of `job_id` (alone or in a batch).
fn acks_of(seen: &[Seen], job_id: &str) -> Vec<Instant> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Request(_, request, at) => match &request.request {
                Some(Request::Ack(a)) if a.job_id == job_id => Some(*at),
                Some(Request::AckBatch(b)) if b.acks.iter().any(|a| a.job_id == job_id) => {
                    Some(*at)
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn worker(addr: &str, handler_delays: &'static [(&'static str, u64)]) -> Worker {
    let mut worker = Worker::builder(addr.to_string())
        .worker_id("answer-retry-test")
        .concurrency(4)
        .grace(Duration::from_secs(5))
        .build()
        .unwrap();
    worker.handle("q", move |job: jobbroker::Job| async move {
        let ms = handler_delays
            .iter()
            .find(|(id, _)| *id == job.id())
            .map_or(0, |(_, ms)| *ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, WorkerError>(job.id().to_uppercase())
    });
    worker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_answered_unavailable_is_sent_again_after_250_ms() {
    let j1_acks = Arc::new(AtomicUsize::new(0));
    let j3_acks = Arc::new(AtomicUsize::new(0));
    let (j1, j3) = (j1_acks.clone(), j3_acks.clone());
    let node = FakeWorkNode::start(Arc::new(move |_, request: &v1::WorkRequest| {
        let id = request.request_id;
        match &request.request {
            Some(Request::Subscribe(_)) => vec![
                now(work_result(id, 0, "")),
                now(leased("j1")),
                now(leased("j2")),
                now(leased("j3")),
            ],
            // j1's ack, alone (j2 and j3 are still running): the whole message is refused,
            // 300 ms later (j2's and j3's acks queue meanwhile); its repeat is accepted.
            Some(Request::Ack(a)) if a.job_id == "j1" => {
                if j1.fetch_add(1, Ordering::SeqCst) == 0 {
                    vec![(
                        Duration::from_millis(300),
                        work_result(id, UNAVAILABLE, "partition 0 has no leader"),
                    )]
                } else {
                    vec![now(work_result(id, 0, ""))]
                }
            }
            // j2's and j3's acks, together: j3's item is refused the first time.
            Some(Request::AckBatch(batch)) => {
                let item_errors = batch
                    .acks
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| a.job_id == "j3" && j3.fetch_add(1, Ordering::SeqCst) == 0)
                    .map(|(index, _)| v1::ItemError {
                        index: index as i32,
                        code: UNAVAILABLE,
                        message: "partition 0 has no leader".into(),
                    })
                    .collect();
                vec![now(Response::Result(v1::WorkResult {
                    request_id: id,
                    item_errors,
                    ..Default::default()
                }))]
            }
            Some(Request::Ack(a)) if a.job_id == "j3" => {
                j3.fetch_add(1, Ordering::SeqCst);
                vec![now(work_result(id, 0, ""))]
            }
            _ => vec![now(work_result(id, 0, ""))],
        }
    }))
    .await;
    let running = Running::start(worker(&node.addr, &[("j2", 50), ("j3", 120)]));

    node.wait_until("j1 acked twice and j3 acked twice", |seen| {
        acks_of(seen, "j1").len() >= 2 && acks_of(seen, "j3").len() >= 2
    })
    .await;
    let seen = node.seen();
    let (j1_times, j3_times) = (acks_of(&seen, "j1"), acks_of(&seen, "j3"));
    // Refused 300 ms after it was sent, sent again 250 ms after that.
    let j1_gap = j1_times[1] - j1_times[0];
    assert!(
        j1_gap >= Duration::from_millis(540),
        "j1's ack went out again {j1_gap:?} after the first (refused after 300 ms, then 250 ms)"
    );
    // j2 and j3 went out together once j1's repeat was answered; j3's item was refused and sent
    // again 250 ms later.
    let batch_has_j2_and_j3 = seen.iter().any(|s| {
        matches!(s, Seen::Request(_, r, _) if matches!(&r.request,
            Some(Request::AckBatch(b)) if b.acks.iter().map(|a| a.job_id.as_str()).collect::<Vec<_>>() == ["j2", "j3"]))
    });
    assert!(batch_has_j2_and_j3, "no ack_batch of j2 and j3: {seen:#?}");
    let j3_gap = j3_times[1] - j3_times[0];
    assert!(
        j3_gap >= Duration::from_millis(240),
        "j3's ack went out again after {j3_gap:?}"
    );
    assert_eq!(
        acks_of(&seen, "j2").len(),
        1,
        "j2's ack was accepted the first time"
    );
    running.stop().await.unwrap();
    // Nothing else was sent again.
    assert_eq!(acks_of(&node.seen(), "j1").len(), 2);
    assert_eq!(acks_of(&node.seen(), "j3").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_answered_unavailable_ends_its_stream_and_the_worker_reconnects() {
    let node = FakeWorkNode::start(Arc::new(|stream, request: &v1::WorkRequest| {
        let id = request.request_id;
        match &request.request {
            // The first stream's subscription is refused, and the stream stays open.
            Some(Request::Subscribe(_)) if stream == 0 => {
                vec![now(work_result(
                    id,
                    UNAVAILABLE,
                    "partition 0 has no leader",
                ))]
            }
            Some(Request::Subscribe(_)) => vec![now(work_result(id, 0, "")), now(leased("j1"))],
            _ => vec![now(work_result(id, 0, ""))],
        }
    }))
    .await;
    let running = Running::start(worker(&node.addr, &[]));

    node.wait_until("j1 acked on the second stream", |seen| {
        seen.iter().any(|s| {
            matches!(s, Seen::Request(1, r, _)
            if matches!(&r.request, Some(Request::Ack(a)) if a.job_id == "j1"))
        })
    })
    .await;
    // The worker ended the refused stream itself, while it kept running.
    node.wait_until("the refused stream ended", |seen| {
        seen.iter().any(|s| matches!(s, Seen::Ended(0, _)))
    })
    .await;
    assert!(!running.task.is_finished(), "the worker stopped");
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_refused_for_good_ends_run_and_its_stream() {
    let node = FakeWorkNode::start(Arc::new(|_, request: &v1::WorkRequest| {
        vec![now(work_result(
            request.request_id,
            INVALID_ARGUMENT,
            "bad queue name",
        ))]
    }))
    .await;
    let running = Running::start(worker(&node.addr, &[]));
    match running.finished().await {
        Err(RunError::Refused(status)) => {
            assert_eq!(status.code(), jobbroker::Code::InvalidArgument)
        }
        other => panic!("run ended with {other:?}"),
    }
    node.wait_until("the refused stream ended", |seen| {
        seen.iter().any(|s| matches!(s, Seen::Ended(0, _)))
    })
    .await;
    assert_eq!(
        node.seen()
            .iter()
            .filter(|s| matches!(s, Seen::Opened(_)))
            .count(),
        1,
        "not retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_sent_to_any_node_moves_to_the_leader_a_later_table_names() {
    let subscribe_ok: common::Script =
        Arc::new(|_, request: &v1::WorkRequest| vec![now(work_result(request.request_id, 0, ""))]);
    // Node b leads the queue's partition once `elected` is set; before, it has no leader.
    let leader = FakeWorkNode::start(subscribe_ok.clone()).await;
    let elected = Arc::new(AtomicBool::new(false));
    let relay_address = Arc::new(OnceLock::<String>::new());
    let cluster: common::ClusterScript = {
        let (elected, relay_address, leader_address) =
            (elected.clone(), relay_address.clone(), leader.addr.clone());
        Arc::new(move || {
            let elected = elected.load(Ordering::SeqCst);
            let node = |id: &str, address: &str| v1::NodeInfo {
                node_id: id.into(),
                address: address.into(),
                alive: true,
            };
            v1::ClusterInfo {
                cluster_name: "fake".into(),
                partition_count: 1,
                nodes: vec![
                    node("a", relay_address.get().unwrap()),
                    node("b", &leader_address),
                ],
                partitions: vec![v1::PartitionInfo {
                    partition: 0,
                    leader_node_id: if elected { "b".into() } else { String::new() },
                    leader_address: if elected {
                        leader_address.clone()
                    } else {
                        String::new()
                    },
                    ..Default::default()
                }],
                ..Default::default()
            }
        })
    };
    // Node a answers GetCluster, and would relay a stream sent to it, for as long as it lasts.
    let relay = FakeWorkNode::start_in_cluster(subscribe_ok, cluster).await;
    relay_address.set(relay.addr.clone()).unwrap();

    let running = Running::start(worker(&relay.addr, &[]));
    relay
        .wait_until("the stream for any node subscribed", |seen| {
            seen.iter().any(|s| {
                matches!(s, Seen::Request(0, r, _) if matches!(&r.request, Some(Request::Subscribe(_))))
            })
        })
        .await;
    // No stream of the worker ends from now on; only a fresh table can move the queue.
    elected.store(true, Ordering::SeqCst);
    leader
        .wait_until("the queue subscribed on its leader", |seen| {
            seen.iter().any(|s| {
                matches!(s, Seen::Request(0, r, _)
                if matches!(&r.request, Some(Request::Subscribe(sub))
                    if sub.queues == ["q"] && sub.max_in_flight == 4))
            })
        })
        .await;
    relay
        .wait_until("the relayed stream ended by the worker", |seen| {
            seen.iter().any(|s| matches!(s, Seen::Ended(0, _)))
        })
        .await;
    running.stop().await.unwrap();
    assert_eq!(
        relay
            .seen()
            .iter()
            .filter(|s| matches!(s, Seen::Opened(_)))
            .count(),
        1,
        "the node for any node got one stream"
    );
}
