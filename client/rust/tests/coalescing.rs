//! Enqueue coalescing (`docs/worker-contract.md` §10) against the real broker: concurrent
//! `enqueue()` calls become fewer calls, each caller still gets its own answer, a refused
//! batch is split, and batches stay within one partition. The broker's own call counters
//! (`jobbroker_rpc_duration_seconds_count` in `/metrics`) tell how many calls were made.

mod common;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::Broker;
use jobbroker::v1::EnqueueResponse;
use jobbroker::{Client, ClientOptions, Code, Status, job, partition_of_queue};

const ENQUEUE: &str = "/jobbroker.v1.Broker/Enqueue";
const ENQUEUE_BATCH: &str = "/jobbroker.v1.Broker/EnqueueBatch";

/// Enqueue and EnqueueBatch calls the broker answered so far, with any code.
fn enqueue_calls(broker: &Broker) -> (u64, u64) {
    (
        broker.rpc_count(ENQUEUE, None),
        broker.rpc_count(ENQUEUE_BATCH, None),
    )
}

/// Runs `n` futures made by `make`, each on a task of its own, all released together by a
/// barrier; their outputs in order.
async fn together<F, Fut, T>(n: usize, make: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let barrier = barrier.clone();
            let call = make(i);
            tokio::spawn(async move {
                barrier.wait().await;
                call.await
            })
        })
        .collect();
    let mut outputs = Vec::with_capacity(n);
    for task in tasks {
        outputs.push(task.await.unwrap());
    }
    outputs
}

/// `n` enqueues of `job(queue, "<queue>-<i>")` on `client`, all at once.
async fn enqueue_many(
    client: &Client,
    queue: &str,
    n: usize,
) -> Vec<Result<EnqueueResponse, Status>> {
    together(n, |i| {
        let (client, queue) = (client.clone(), queue.to_string());
        async move { client.enqueue(job(&queue, format!("{queue}-{i}"))).await }
    })
    .await
}

async fn ready_count(client: &Client, queue: &str) -> i64 {
    let info = client.get_queue(queue).await.unwrap();
    info.counts.get("JOB_STATE_READY").copied().unwrap_or(0)
}

async fn connect(broker: &Broker, options: ClientOptions) -> Client {
    let client = Client::connect(options.address(broker.addr.as_str()))
        .await
        .unwrap();
    // The routing table first, so that the calls counted are the enqueues only.
    client.list_queues().await.unwrap();
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_with_a_linger_go_out_in_batches() {
    let broker = Broker::start();
    let client = connect(
        &broker,
        ClientOptions::new().batch_linger(Duration::from_millis(50)),
    )
    .await;
    let before = enqueue_calls(&broker);

    let results = enqueue_many(&client, "linger", 200).await;
    let ids: HashSet<String> = results.into_iter().map(|r| r.unwrap().job_id).collect();
    assert_eq!(ids.len(), 200, "one distinct job per call");
    assert_eq!(ready_count(&client, "linger").await, 200);

    let (unary, batches) = enqueue_calls(&broker);
    let calls = (unary - before.0) + (batches - before.1);
    assert!(calls <= 100, "{calls} calls for 200 jobs");
    assert!(batches > before.1, "no EnqueueBatch among {calls} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_options_concurrent_enqueues_take_fewer_calls_than_jobs() {
    let broker = Broker::start();
    let client = connect(&broker, ClientOptions::new()).await;
    let before = enqueue_calls(&broker);

    let results = enqueue_many(&client, "default", 200).await;
    let ids: HashSet<String> = results.into_iter().map(|r| r.unwrap().job_id).collect();
    assert_eq!(ids.len(), 200);
    assert_eq!(ready_count(&client, "default").await, 200);

    let (unary, batches) = enqueue_calls(&broker);
    let calls = (unary - before.0) + (batches - before.1);
    assert!(calls < 200, "{calls} calls for 200 jobs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_job_fails_only_its_own_call_with_the_unary_message() {
    let broker = Broker::start();
    let client = connect(
        &broker,
        ClientOptions::new().batch_linger(Duration::from_millis(50)),
    )
    .await;
    let refused_before = broker.rpc_count(ENQUEUE_BATCH, Some("INVALID_ARGUMENT"));
    const BAD: usize = 25;

    let results = together(50, |i| {
        let client = client.clone();
        let mut request = job("split", format!("job-{i}"));
        if i == BAD {
            request = request.with_header("", "no name");
        }
        async move { client.enqueue(request).await }
    })
    .await;

    for (i, result) in results.iter().enumerate() {
        if i == BAD {
            let status = result.as_ref().unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains("headers"), "{status:?}");
            assert!(!status.message().contains("jobs["), "{status:?}");
        } else {
            let sent = result.as_ref().unwrap_or_else(|e| panic!("job {i}: {e:?}"));
            let stored = client.get_job(&sent.job_id).await.unwrap();
            assert_eq!(stored.payload, format!("job-{i}").as_bytes());
        }
    }
    assert_eq!(ready_count(&client, "split").await, 49);
    let refused = broker.rpc_count(ENQUEUE_BATCH, Some("INVALID_ARGUMENT"));
    assert!(
        refused > refused_before,
        "no EnqueueBatch was refused: the split path did not run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_off_for_a_call_or_a_client_sends_unary_enqueues() {
    let broker = Broker::start();
    let client = connect(&broker, ClientOptions::new()).await;

    let before = enqueue_calls(&broker);
    client
        .with_batching(false)
        .enqueue(job("alone", "one"))
        .await
        .unwrap();
    let after = enqueue_calls(&broker);
    assert_eq!(after.0, before.0 + 1, "one unary Enqueue");
    assert_eq!(after.1, before.1, "no EnqueueBatch");

    let unbatched = connect(&broker, ClientOptions::new().batching(false)).await;
    let results = enqueue_many(&unbatched, "alone", 20).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let end = enqueue_calls(&broker);
    assert_eq!(end.0, after.0 + 20, "20 unary Enqueue calls");
    assert_eq!(end.1, after.1, "no EnqueueBatch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_of_one_dedup_key_get_one_job() {
    let broker = Broker::start();
    let client = connect(&broker, ClientOptions::new()).await;

    // The same payload each time: the key with another payload would be ALREADY_EXISTS.
    let results = together(20, |_| {
        let client = client.clone();
        async move {
            client
                .enqueue(job("dedup", "same").with_dedup_key("order-1"))
                .await
        }
    })
    .await;
    let results: Vec<EnqueueResponse> = results.into_iter().map(Result::unwrap).collect();
    let ids: HashSet<&str> = results.iter().map(|r| r.job_id.as_str()).collect();
    assert_eq!(ids.len(), 1, "{results:?}");
    let created = results.iter().filter(|r| !r.deduplicated).count();
    assert_eq!(created, 1, "{results:?}");
    assert_eq!(ready_count(&client, "dedup").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_stay_within_a_partition() {
    let broker = Broker::start_with_args(None, &["--partitions", "4"]);
    let client = connect(
        &broker,
        ClientOptions::new().batch_linger(Duration::from_millis(50)),
    )
    .await;
    // Two queues in each of the 4 partitions.
    let mut queues: Vec<String> = Vec::new();
    for partition in 0..4 {
        let mut found = (0..)
            .map(|i| format!("part-{i}"))
            .filter(|q| partition_of_queue(q, 4) == partition);
        queues.extend(found.by_ref().take(2));
    }
    assert_eq!(queues.len(), 8);

    let results = together(200, |i| {
        let client = client.clone();
        let queue = queues[i % 8].clone();
        async move { client.enqueue(job(&queue, format!("{i}"))).await }
    })
    .await;
    for (i, result) in results.iter().enumerate() {
        assert!(result.is_ok(), "job {i}: {result:?}");
    }
    for queue in &queues {
        assert_eq!(ready_count(&client, queue).await, 25, "{queue}");
    }
    // A batch spanning partitions would have been refused (and split): none was.
    assert_eq!(broker.rpc_count(ENQUEUE_BATCH, Some("INVALID_ARGUMENT")), 0);
    assert!(broker.rpc_count(ENQUEUE_BATCH, None) > 0, "no batch at all");
}

#[tokio::test(flavor = "current_thread")]
async fn close_sends_a_lingering_batch_after_the_middleware_ran_per_call() {
    let broker = Broker::start();
    let seen = Arc::new(AtomicUsize::new(0));
    let client = connect(
        &broker,
        ClientOptions::new().batch_linger(Duration::from_secs(3600)),
    )
    .await
    .with_producer_middleware({
        let seen = seen.clone();
        move |request, next| {
            seen.fetch_add(1, Ordering::SeqCst);
            next.run(request)
        }
    });
    let before = enqueue_calls(&broker);

    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.enqueue(job("closing", format!("{i}"))).await })
        })
        .collect();
    // One thread: once all five passed the middleware, each waits in the open batch.
    while seen.load(Ordering::SeqCst) < 5 {
        tokio::task::yield_now().await;
    }
    tokio::task::yield_now().await;
    assert_eq!(
        enqueue_calls(&broker),
        before,
        "nothing sent while lingering"
    );

    client.close().await;
    assert_eq!(
        enqueue_calls(&broker),
        (before.0, before.1 + 1),
        "one EnqueueBatch for the five"
    );
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(ready_count(&client, "closing").await, 5);
    // After close an enqueue goes alone.
    client.enqueue(job("closing", "late")).await.unwrap();
    assert_eq!(enqueue_calls(&broker).0, before.0 + 1);
}

#[tokio::test]
async fn a_batch_option_out_of_range_is_refused_when_the_client_is_made() {
    for options in [
        ClientOptions::new().batch_max_jobs(0),
        ClientOptions::new().batch_max_jobs(1001),
    ] {
        let error = Client::new(options.address("127.0.0.1:1")).unwrap_err();
        assert!(error.to_string().contains("batch_max_jobs"), "{error}");
    }
}
