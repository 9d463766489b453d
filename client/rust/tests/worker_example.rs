//! Runs examples/worker.rs as a real process against the real broker: it completes jobs
//! (retrying a failed one, heartbeating a job longer than its lease), drains on SIGTERM while a
//! job runs, and exits 0.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{Broker, GIVE_UP, wait_for_state};
use jobbroker::v1::{AttemptOutcome, CancelJobRequest, EnqueueRequest, FailReason, JobState};
use jobbroker::{duration, job};

const CONFIG: &str = r#"{"queues": {"demo": {"retry": {"maxAttempts": 3, "initialBackoff": "0.05s", "jitter": "JITTER_NONE"}, "leaseDuration": "1s"}}}"#;

/// target/debug/examples/worker, next to this test's own executable (target/debug/deps/).
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = profile_dir.join("examples/worker");
    assert!(
        bin.exists(),
        "{} not built: run `cargo test` (which builds the examples) or `cargo build --example worker`",
        bin.display()
    );
    bin
}

struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    fn start(addr: &str, queue: &str) -> Self {
        let mut child = Command::new(example_binary())
            .args([
                "--address",
                addr,
                "--queue",
                queue,
                "--concurrency",
                "2",
                "--grace-secs",
                "20",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the worker example");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                println!("[worker] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker { child, lines }
    }

    /// Waits for a stdout line containing `needle`.
    fn wait_for_line(&self, needle: &str) {
        let give_up = std::time::Instant::now() + GIVE_UP;
        loop {
            let left = give_up.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!("worker never printed {needle:?}"),
            }
        }
    }

    fn terminate(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// Waits for the process to exit (give-up bound GIVE_UP); returns its exit code.
    fn wait(&mut self) -> Option<i32> {
        let give_up = std::time::Instant::now() + GIVE_UP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(std::time::Instant::now() < give_up, "worker did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[tokio::test]
async fn worker_example_completes_jobs_and_drains_on_sigterm() {
    let broker = Broker::start_with_config(Some(CONFIG));
    let client = broker.client().await;
    let mut worker = Worker::start(&broker.addr, "demo");
    worker.wait_for_line("working demo");

    let plain: Vec<String> = client
        .enqueue_batch((0..3).map(|i| job("demo", format!("hello {i}"))).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.job_id)
        .collect();
    let flaky = client.enqueue(job("demo", "flaky")).await.unwrap().job_id;
    let poison = client.enqueue(job("demo", "poison")).await.unwrap().job_id;
    // Three times its 1 s lease: only heartbeats keep it alive.
    let long = client
        .enqueue(job("demo", "sleep:3000"))
        .await
        .unwrap()
        .job_id;

    for (i, id) in plain.iter().enumerate() {
        let done = wait_for_state(&client, id, JobState::Completed).await;
        assert_eq!(done.result, format!("HELLO {i}").into_bytes());
        assert_eq!(done.attempt, 1);
    }
    let done = wait_for_state(&client, &flaky, JobState::Completed).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(done.attempts[0].outcome, AttemptOutcome::Error as i32);
    let dead = wait_for_state(&client, &poison, JobState::Failed).await;
    assert_eq!(dead.fail_reason, FailReason::Permanent as i32);
    assert_eq!(dead.attempt, 1);
    let done = wait_for_state(&client, &long, JobState::Completed).await;
    assert_eq!(done.attempt, 1, "the heartbeats kept the 1 s lease alive");

    // An operator cancels a running job: the worker is told, stops it and fails it.
    let stuck = client
        .enqueue(job("demo", "sleep:600000"))
        .await
        .unwrap()
        .job_id;
    wait_for_state(&client, &stuck, JobState::Active).await;
    client
        .admin()
        .cancel_job(CancelJobRequest {
            job_id: stuck.clone(),
        })
        .await
        .unwrap();
    let cancelled = wait_for_state(&client, &stuck, JobState::Cancelled).await;
    assert_eq!(cancelled.attempt, 1);

    // SIGTERM while jobs run: the running ones finish and are acked, the rest stay READY
    // (nothing lost, nothing left ACTIVE), and the process exits 0.
    let batch: Vec<String> = client
        .enqueue_batch(
            (0..5)
                .map(|_| EnqueueRequest {
                    lease_duration: Some(duration(Duration::from_secs(10))),
                    ..job("demo", "sleep:1500")
                })
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.job_id)
        .collect();
    // Its handler has started (ACTIVE at the broker only says it was pushed: a job still on its
    // way when the stop begins is released, unstarted).
    worker.wait_for_line(&format!("job {} sleeps", batch[0]));
    worker.terminate();
    assert_eq!(worker.wait(), Some(0));
    for id in &batch {
        let state = client.get_job(id).await.unwrap().state;
        assert!(
            state == JobState::Completed as i32 || state == JobState::Ready as i32,
            "job {id} left in {:?}",
            JobState::try_from(state)
        );
    }
    assert_eq!(
        client.get_job(&batch[0]).await.unwrap().state,
        JobState::Completed as i32
    );
}
