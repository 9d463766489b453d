//! Every enqueue option as a `with_` method of [`v1::EnqueueRequest`], in std types:
//!
//! ```
//! use std::time::Duration;
//! use jobbroker::job;
//!
//! let request = job("emails", r#"{"to":"ada@example.com"}"#)
//!     .with_priority(5)
//!     .with_delay(Duration::from_secs(60))
//!     .with_dedup_key("welcome:ada")
//!     .with_header("tenant", "acme");
//! assert_eq!(request.priority, 5);
//! ```
//!
//! The fields stay public, so struct update syntax works too.

use std::time::{Duration, SystemTime};

use crate::{duration, timestamp, v1};

impl v1::EnqueueRequest {
    /// Higher runs first; FIFO within one priority. Default 0.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Run no earlier than this long from now (clears [`Self::with_run_at`]).
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = Some(duration(delay));
        self.run_at = None;
        self
    }

    /// Run no earlier than this time (clears [`Self::with_delay`]).
    pub fn with_run_at(mut self, at: SystemTime) -> Self {
        self.run_at = Some(timestamp(at));
        self.delay = None;
        self
    }

    /// Attempts in total, the first included; default the queue's.
    pub fn with_max_attempts(mut self, attempts: i32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The lease when the worker names none; default the queue's.
    pub fn with_lease_duration(mut self, lease: Duration) -> Self {
        self.lease_duration = Some(duration(lease));
        self
    }

    /// While a job of the queue holds this key, enqueuing it again returns that job
    /// (`deduplicated`). It also makes the enqueue safe to send again after `UNAVAILABLE`,
    /// which the client then does.
    pub fn with_dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = key.into();
        self
    }

    /// How long the dedup key blocks duplicates; default the queue's `dedup_ttl`.
    pub fn with_dedup_ttl(mut self, ttl: Duration) -> Self {
        self.dedup_ttl = Some(duration(ttl));
        self
    }

    /// Groups jobs for the queue's `max_concurrency_per_key` (a tenant id, say).
    pub fn with_concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = key.into();
        self
    }

    /// Adds one header (handed to the worker as is).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The run-time limit of each attempt (100 ms to 720 h); default the queue's.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(duration(timeout));
        self
    }

    /// No attempt starts at or after this time: a job still waiting then ends FAILED,
    /// `FAIL_REASON_EXPIRED`.
    pub fn with_expire_at(mut self, at: SystemTime) -> Self {
        self.expire_at = Some(timestamp(at));
        self
    }

    /// Waits for this job (an id an enqueue returned) to complete first; call it once per
    /// job waited for.
    pub fn with_depends_on(mut self, job_id: impl Into<String>) -> Self {
        self.depends_on.push(job_id.into());
        self
    }

    /// Inside [`Client::enqueue_batch`](crate::Client::enqueue_batch) only: waits for the
    /// job at this (earlier) index of the same batch.
    pub fn with_depends_on_index(mut self, index: i32) -> Self {
        self.depends_on_index.push(index);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job;

    #[test]
    fn every_option_lands_in_its_field() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let request = job("q", "p")
            .with_priority(3)
            .with_max_attempts(4)
            .with_lease_duration(Duration::from_secs(5))
            .with_dedup_key("k")
            .with_dedup_ttl(Duration::from_secs(6))
            .with_concurrency_key("tenant")
            .with_header("a", "1")
            .with_timeout(Duration::from_millis(1500))
            .with_expire_at(at)
            .with_depends_on("j1")
            .with_depends_on_index(0)
            .with_delay(Duration::from_secs(7));
        assert_eq!(request.priority, 3);
        assert_eq!(request.max_attempts, 4);
        assert_eq!(request.lease_duration.unwrap().seconds, 5);
        assert_eq!(request.dedup_key, "k");
        assert_eq!(request.dedup_ttl.unwrap().seconds, 6);
        assert_eq!(request.concurrency_key, "tenant");
        assert_eq!(request.headers["a"], "1");
        let timeout = request.timeout.unwrap();
        assert_eq!((timeout.seconds, timeout.nanos), (1, 500_000_000));
        assert_eq!(request.expire_at.unwrap().seconds, 2_000_000_000);
        assert_eq!(request.depends_on, ["j1"]);
        assert_eq!(request.depends_on_index, [0]);
        assert_eq!(request.delay.unwrap().seconds, 7);
        assert!(request.run_at.is_none());
        let request = request.with_run_at(at);
        assert!(request.delay.is_none());
        assert_eq!(request.run_at.unwrap().seconds, 2_000_000_000);
    }
}
