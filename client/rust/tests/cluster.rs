//! The `Client` and the `Worker` against a real 3-node cluster: each call goes straight to its
//! partition's leader, a worker holds one stream per leading node, and both follow a leader
//! that was killed.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{CLUSTER_GIVE_UP, Cluster, Running};
use jobbroker::v1::{ClusterInfo, JobState};
use jobbroker::{Client, ClientOptions, Job, Worker, job, partition_of_job_id, partition_of_queue};

const PARTITIONS: u32 = 4;

/// The addresses a client's calls were sent to, attempt by attempt.
#[derive(Clone, Default)]
struct Targets(Arc<Mutex<Vec<String>>>);

impl Targets {
    /// `client`, recording here where each of its calls goes.
    fn observe(&self, client: &Client) -> Client {
        let targets = self.0.clone();
        client.with_target_observer(move |address| targets.lock().unwrap().push(address.into()))
    }

    /// What was recorded since the last take.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// The clusters of this file run one at a time: each is etcd and three nodes, on a small
/// machine shared with other tests.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The first queue named `<prefix>-<n>` that lives in `partition` (of [`PARTITIONS`]).
fn queue_in(prefix: &str, partition: u32) -> String {
    queue_in_of(prefix, partition, PARTITIONS)
}

/// The first queue named `<prefix>-<n>` that lives in `partition` of `count`.
fn queue_in_of(prefix: &str, partition: u32, count: u32) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|q| partition_of_queue(q, count) == partition)
        .unwrap()
}

fn leader_of(info: &ClusterInfo, partition: u32) -> String {
    let entry = info
        .partitions
        .iter()
        .find(|p| p.partition == partition)
        .unwrap_or_else(|| panic!("GetCluster lists no partition {partition}: {info:?}"));
    entry.leader_address.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_to_their_partitions_leader_and_follow_a_leader_that_was_killed() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().await;
    let mut cluster = Cluster::start(PARTITIONS).await;
    let options = || ClientOptions::new().addresses(cluster.addresses.clone());
    let targets = Targets::default();
    let client = targets.observe(&Client::new(options()).unwrap());
    let info = client.get_cluster().await.unwrap();
    assert_eq!(info.partition_count, PARTITIONS);
    targets.take();

    // One queue per partition: its enqueue, a get of the job and a queue admin call each go
    // to the partition's leader.
    for partition in 0..PARTITIONS {
        let queue = queue_in("routed", partition);
        let leader = leader_of(&info, partition);
        let sent = client
            .enqueue(job(&queue, "x").with_dedup_key("routed"))
            .await
            .unwrap();
        assert_eq!(
            targets.take(),
            std::slice::from_ref(&leader),
            "enqueue to {queue}"
        );
        assert_eq!(
            partition_of_job_id(&sent.job_id, PARTITIONS),
            Some(partition)
        );
        client.get_job(&sent.job_id).await.unwrap();
        assert_eq!(
            targets.take(),
            std::slice::from_ref(&leader),
            "get of a job of {queue}"
        );
        client.pause_queue(&queue).await.unwrap();
        assert_eq!(
            targets.take(),
            std::slice::from_ref(&leader),
            "pause of {queue}"
        );
    }

    // A worker of one queue, its stream straight to the queue's leader; three jobs completed
    // (and acknowledged) before that leader dies.
    let queue = queue_in("survivor", 0);
    let streams = Targets::default();
    let worker_client = streams.observe(&Client::new(options()).unwrap());
    let mut worker = Worker::builder(options())
        .client(worker_client)
        .build()
        .unwrap();
    worker.handle(&queue, |job: Job| async move {
        Ok(format!("done {}", job.text()?))
    });
    let running = Running::start(worker);
    let mut acked = Vec::new();
    for n in 0..3 {
        let request = job(&queue, format!("{n}")).with_dedup_key(format!("before-{n}"));
        let done = client
            .enqueue_and_wait(request, Some(CLUSTER_GIVE_UP))
            .await
            .unwrap();
        assert_eq!(done.result, format!("done {n}").as_bytes());
        acked.push(done.id);
    }
    assert_eq!(streams.take().first(), Some(&leader_of(&info, 0)));

    let info = client.get_cluster().await.unwrap();
    let dead = leader_of(&info, 0);
    cluster.kill9(&dead);
    targets.take();

    // An enqueue with a dedup key lands again within the give-up time, on the new leader.
    let give_up = tokio::time::Instant::now() + CLUSTER_GIVE_UP;
    let after = job(&queue, "after").with_dedup_key("after-the-kill");
    let sent = loop {
        match client.enqueue(after.clone()).await {
            Ok(sent) => break sent,
            Err(status) => {
                assert!(
                    tokio::time::Instant::now() < give_up,
                    "no enqueue landed after the leader's death: {status}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let landed_on = targets.take().pop().unwrap();
    assert_ne!(landed_on, dead);
    let info = client.get_cluster().await.unwrap();
    assert_eq!(leader_of(&info, 0), landed_on, "{info:?}");

    // The jobs acknowledged before the kill are still COMPLETED, and the worker followed the
    // leader: it completes the job enqueued after the kill.
    for id in &acked {
        let job = client.get_job(id).await.unwrap();
        assert_eq!(job.state, JobState::Completed as i32, "{job:?}");
    }
    let done = client
        .wait_for_job(&sent.job_id, Some(CLUSTER_GIVE_UP))
        .await
        .unwrap();
    assert_eq!(done.result, b"done after");
    running.stop().await.unwrap();
}

/// GetCluster once every partition has a leader and no node leads two (the controller moves
/// leaders to their preferred nodes after a start).
async fn balanced_leaders(client: &Client) -> ClusterInfo {
    let give_up = tokio::time::Instant::now() + CLUSTER_GIVE_UP;
    loop {
        let answer = client.get_cluster().await;
        if let Ok(info) = &answer {
            let leaders: HashSet<&str> = info
                .partitions
                .iter()
                .map(|p| p.leader_address.as_str())
                .filter(|a| !a.is_empty())
                .collect();
            if info.partitions.len() == info.partition_count as usize
                && leaders.len() == info.partitions.len()
            {
                return info.clone();
            }
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the partitions never had leaders on different nodes: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Enqueues `count` jobs on each of `queues` (retrying, with dedup keys, while a partition is
/// between leaders) and waits until every one is COMPLETED.
async fn all_complete(client: &Client, queues: &[&str], tag: &str, count: usize) {
    let mut sent = Vec::new();
    let give_up = tokio::time::Instant::now() + CLUSTER_GIVE_UP;
    for queue in queues {
        for n in 0..count {
            let request = job(queue, format!("{n}")).with_dedup_key(format!("{tag}-{n}"));
            loop {
                match client.enqueue(request.clone()).await {
                    Ok(job) => break sent.push(job.job_id),
                    Err(status) => {
                        assert!(
                            tokio::time::Instant::now() < give_up,
                            "no enqueue to {queue} landed: {status}"
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    }
    for id in &sent {
        let done = client
            .wait_for_job(id, Some(CLUSTER_GIVE_UP))
            .await
            .unwrap_or_else(|e| panic!("job {id} did not complete: {e}"));
        assert_eq!(done.state, JobState::Completed as i32, "{done:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_one_stream_per_leading_node_and_regroups_when_a_leader_dies() {
    let _one_cluster_at_a_time = ONE_CLUSTER.lock().await;
    let mut cluster = Cluster::start(2).await;
    let client = Client::new(ClientOptions::new().addresses(cluster.addresses.clone())).unwrap();
    let info = balanced_leaders(&client).await;
    let (leader_a, leader_b) = (leader_of(&info, 0), leader_of(&info, 1));
    let neither = cluster
        .addresses
        .iter()
        .find(|a| **a != leader_a && **a != leader_b)
        .unwrap()
        .clone();
    let (queue_a, queue_b) = (
        queue_in_of("per-leader", 0, 2),
        queue_in_of("per-leader", 1, 2),
    );

    // The node that leads neither queue comes first: a worker that connected to the first
    // address that answers would have it relay both.
    let order = vec![neither.clone(), leader_a.clone(), leader_b.clone()];
    let mut worker = Worker::builder(ClientOptions::new().addresses(order))
        .concurrency(4)
        .build()
        .unwrap();
    for queue in [&queue_a, &queue_b] {
        worker.handle(queue, |job: Job| async move {
            Ok(format!("done {}", job.text()?))
        });
    }
    let running = Running::start(worker);
    all_complete(&client, &[&queue_a, &queue_b], "before", 10).await;
    for node in &cluster.addresses {
        assert_eq!(
            cluster.metric(node, "jobbroker_work_streams_relaying"),
            0.0,
            "node {node} relays a stream of the worker"
        );
    }
    let open = |node: &str| cluster.metric(node, "jobbroker_work_streams_open");
    assert!(
        open(&leader_a) >= 1.0,
        "no stream on {leader_a}, leader of {queue_a}"
    );
    assert!(
        open(&leader_b) >= 1.0,
        "no stream on {leader_b}, leader of {queue_b}"
    );
    assert_eq!(
        open(&neither),
        0.0,
        "a stream on {neither}, which leads nothing of the worker's"
    );

    // The leader of one queue dies: its stream ends, the worker regroups onto the new leader
    // (the other stream stays), and the jobs of both queues still complete.
    cluster.kill9(&leader_a);
    all_complete(&client, &[&queue_a, &queue_b], "after", 10).await;
    let live: Vec<String> = cluster
        .addresses
        .iter()
        .filter(|a| **a != leader_a)
        .cloned()
        .collect();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let relaying: Vec<f64> = live
            .iter()
            .map(|node| cluster.metric(node, "jobbroker_work_streams_relaying"))
            .collect();
        if relaying.iter().all(|r| *r == 0.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the live nodes {live:?} still relay the worker's streams ({relaying:?}) 30 s after \
             the leader's death"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    running.stop().await.unwrap();
}
