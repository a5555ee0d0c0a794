//! Which invocation an AWS call belongs to: a task-local the host sets around each
//! invocation, read by the faulty HTTP client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[cfg(doc)]
use super::INVOCATION_HEADER;

/// Numbers invocations, for [`INVOCATION_HEADER`].
static NEXT_INVOCATION: AtomicU64 = AtomicU64::new(1);

tokio::task_local! {
    pub(super) static INVOCATION: Invocation;
}

/// The invocation a task runs: which function, for which job and lease, and how to tell the
/// host that it crashed.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// Unique per invocation (within the process).
    pub id: u64,
    /// The function's logical name.
    pub function: String,
    /// The job the event names, if any.
    pub job_id: Option<String>,
    /// The lease the event carries, if any.
    pub lease: Option<String>,
    /// What the per-job crash cap counts against: the job, for an SQS or stream batch its
    /// first message or record (a redelivered batch must not crash until it is dead-lettered),
    /// for an API request its `Idempotency-Key` (the submission a client retries).
    pub(super) crash_key: Option<String>,
    crashed: Arc<Notify>,
    aws: Arc<Mutex<AwsUse>>,
}

/// The AWS calls one invocation made, and the time it spent waiting for them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AwsUse {
    /// Calls made (SDK attempts: a retried call counts each attempt).
    pub calls: u32,
    /// Wall time from handing each request to the HTTP client to its response head.
    pub time: std::time::Duration,
}

impl Invocation {
    /// An invocation of `function` with `event` (read for `job_id` and `lease.token`, or
    /// `state.lease.token` as the state machine's `Run` state passes it).
    pub fn new(function: &str, event: Option<&serde_json::Value>) -> Self {
        let field = |path: &[&str]| {
            let mut value = event?;
            for name in path {
                value = value.get(name)?;
            }
            value.as_str().map(str::to_owned)
        };
        let job_id = field(&["job_id"]);
        let first = event.and_then(|e| e.get("Records")?.get(0));
        let first_message = first
            .and_then(|r| r.get("messageId")?.as_str())
            .map(|id| format!("message {id}"))
            .or_else(|| {
                first
                    .and_then(|r| r["dynamodb"]["SequenceNumber"].as_str())
                    .map(|seq| format!("record {seq}"))
            });
        Invocation {
            id: NEXT_INVOCATION.fetch_add(1, Ordering::Relaxed),
            function: function.to_owned(),
            crash_key: job_id.clone().or(first_message).or_else(|| {
                let key = event?.get("headers")?.get("idempotency-key")?.as_str()?;
                Some(format!("submission {key}"))
            }),
            job_id,
            lease: field(&["lease", "token"]).or_else(|| field(&["state", "lease", "token"])),
            crashed: Arc::new(Notify::new()),
            aws: Arc::default(),
        }
    }

    /// Runs `future` as this invocation (its AWS calls are subject to the fault plan).
    pub fn scope<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        INVOCATION.scope(self.clone(), future)
    }

    /// Completes when a fault crashed this invocation.
    pub async fn crashed(&self) {
        self.crashed.notified().await;
    }

    /// The AWS calls this invocation made so far.
    pub fn aws_use(&self) -> AwsUse {
        *self.aws.lock().expect("aws use")
    }

    pub(super) fn count_call(&self, time: std::time::Duration) {
        let mut aws = self.aws.lock().expect("aws use");
        aws.calls += 1;
        aws.time += time;
    }

    pub(super) fn crash(&self) {
        // `notify_one` keeps a permit if the host is not waiting yet.
        self.crashed.notify_one();
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An invocation of the stage function for `job`, under lease `t1`.
    pub(in crate::checks::faults) fn invocation(job: &str) -> Invocation {
        Invocation::new(
            "StageFunction",
            Some(&serde_json::json!({"job_id": job, "lease": {"token": "t1"}})),
        )
    }

    #[test]
    fn an_invocation_reads_job_and_lease_from_its_event() {
        let i = invocation("j1");
        assert_eq!((i.job_id.as_deref(), i.lease.as_deref()), (Some("j1"), Some("t1")));
        let bare = Invocation::new("DispatcherFunction", Some(&serde_json::json!({"Records": []})));
        assert_eq!((bare.job_id, bare.lease), (None, None));
        let batch = Invocation::new(
            "DispatcherFunction",
            Some(&serde_json::json!({"Records": [{"messageId": "m1"}]})),
        );
        assert_eq!(
            batch.crash_key.as_deref(),
            Some("message m1"),
            "a batch's crashes are capped by its first message"
        );
        let stream = Invocation::new(
            "NotifierFunction",
            Some(&serde_json::json!({"Records": [{"dynamodb": {"SequenceNumber": "7"}}]})),
        );
        assert_eq!(
            stream.crash_key.as_deref(),
            Some("record 7"),
            "a stream batch's by its first record"
        );
    }
}
