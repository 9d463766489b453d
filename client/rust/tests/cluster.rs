//! The `Client` and the `Worker` against a real 3-node cluster of 4 partitions: each call goes
//! straight to its partition's leader, and both follow a leader that was killed.

mod common;

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

/// The first queue named `<prefix>-<n>` that lives in `partition`.
fn queue_in(prefix: &str, partition: u32) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|q| partition_of_queue(q, PARTITIONS) == partition)
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
