//! The job's moves besides plain transitions: claim, cancel, and the fenced counters and marks.

use super::*;

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_domain::admission::Waiting;
use longhaul_domain::{Cancellation, JobStatus, now_rfc3339};

use crate::AwsError;

/// What a cancellation did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The job was not running yet and is now `cancelled`.
    Cancelled(Box<JobRecord>),
    /// The job is running; its stage will stop at its next progress write.
    Requested(Box<JobRecord>),
}

impl JobStore {
    /// Cancels a job for its owner: a `pending`, `queued` or `paused` job becomes `cancelled` at
    /// once;
    /// a `running` job gets a cancellation request that its stage sees at its next progress
    /// write (the flag is set on the progress record too, which that write is conditional on).
    /// Repeating the request for a running job keeps the first request on the job record and
    /// sets the flag again (idempotently, with the first request's time): a retry after a
    /// failed flag write is what gets the flag to the worker. A terminal job is a conflict.
    /// A failed write is an error, and the caller's retry does the rest.
    pub async fn cancel(
        &self,
        job_id: &JobId,
        cancellation: &Cancellation,
    ) -> Result<CancelOutcome, StoreError> {
        let value: AttributeValue =
            serde_dynamo::to_attribute_value(cancellation).expect("cancellations serialise");
        let reason = cancellation.log_reason();
        // A running job can turn `queued` between the two writes below (its attempt failed
        // and its next one was scheduled): then the first write applies after all. Each round
        // needs the job to have moved between our writes; three are plenty.
        let mut rounds = 0;
        let job = loop {
            rounds += 1;
            let request = TransitionRequest::new(
                job_id,
                &[JobStatus::Pending, JobStatus::Queued, JobStatus::Paused],
                JobStatus::Cancelled,
                reason.clone(),
            )
            .set("cancellation", cancellation)
            // One that started stages with an undo compensates first: its caller moves it.
            .unless_compensable();
            let current = match self.transition(request).await {
                Ok(job) => return Ok(CancelOutcome::Cancelled(Box::new(job))),
                Err(StoreError::Conflict { current: Some(job) })
                    if job.status == JobStatus::Running =>
                {
                    job
                }
                Err(err) => return Err(err),
            };
            // Asked before: the request stands, and its flag is set again below.
            if current.cancellation.is_some() {
                break current;
            }
            let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
            let values = HashMap::from([
                (":running".to_owned(), s(JobStatus::Running.as_str())),
                (":c".to_owned(), value.clone()),
                (":now".to_owned(), s(now_rfc3339())),
            ]);
            match self
                .update_job(
                    job_id,
                    "SET cancellation = :c, updated_at = :now".into(),
                    "#status = :running AND attribute_not_exists(cancellation)".into(),
                    names,
                    values,
                )
                .await
            {
                Ok(job) => break Box::new(job),
                // Back to waiting for an attempt: cancel it as such.
                Err(StoreError::Conflict { current: Some(job) })
                    if matches!(job.status, JobStatus::Pending | JobStatus::Queued)
                        && rounds < 3 => {}
                // Another request got there first: its flag is set again below.
                Err(StoreError::Conflict { current: Some(job) })
                    if job.status == JobStatus::Running =>
                {
                    break job;
                }
                // The job just ended (a conflict that carries it), or the write failed.
                Err(err) => return Err(err),
            }
        };
        // The request on record (the first one, if this repeats it) is the one flagged.
        let requested_at =
            job.cancellation.as_ref().map_or(&cancellation.requested_at, |c| &c.requested_at);
        self.flag_cancellation(job_id, requested_at).await?;
        Ok(CancelOutcome::Requested(job))
    }

    /// Sets the cancellation flag on the job's progress record, which every progress write
    /// is conditional on the absence of. Idempotent: a flag already set keeps its time.
    async fn flag_cancellation(
        &self,
        job_id: &JobId,
        requested_at: &Timestamp,
    ) -> Result<(), StoreError> {
        self.flag_progress(job_id, "cancel_requested_at", Some(*requested_at)).await.map(drop)
    }

    /// Sets the owner's request `flag` (an attribute of the job's progress record, which
    /// progress writes are conditional on the absence of) with its time `at` — idempotent, a
    /// flag already set keeps its time — or, `None`, removes it: whether the record had it to
    /// remove. A running job may have no record yet (its first claim hands none over:
    /// [`JobStore::claim_as`]): setting a flag then writes the record, under no lease, with
    /// the fields a hand-over would give it, so the attempt's first progress write finds the
    /// request (a record under no lease is one the attempt may write).
    pub(super) async fn flag_progress(
        &self,
        job_id: &JobId,
        flag: &str,
        at: Option<Timestamp>,
    ) -> Result<bool, StoreError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()));
        // The flag by its name in the expression (one of ours, not a reserved word), as the
        // request shows it.
        let flagged = match at {
            Some(at) => self
                .record_defaults(update)
                .update_expression(format!(
                    "SET {flag} = if_not_exists({flag}, :at), {}",
                    super::progress::RECORD_DEFAULTS
                ))
                .expression_attribute_values(":at", s(at.to_rfc3339())),
            None => update
                .condition_expression("attribute_exists(pk)")
                .update_expression(format!("REMOVE {flag}")),
        }
        .send()
        .await;
        match flagged {
            Ok(_) => Ok(true),
            Err(err) if crate::condition_refused(&err) => Ok(false),
            Err(err) => Err(AwsError::new(format!("set {flag} of job {job_id}"), err).into()),
        }
    }

    /// [`Self::claim_as`] by an execution (no claimant).
    pub async fn claim(
        &self,
        job_id: &JobId,
        execution: &str,
    ) -> Result<(Lease, JobRecord), StoreError> {
        let (lease, view) = self.claim_as(job_id, execution, None).await?;
        Ok((lease, view.job))
    }

    /// `queued → running` for `execution`, minting a new lease (the job enters the reaper's
    /// running index in the same write), then hands the progress record to it — except at a
    /// job's first claim with no record seeded ([`JobRecord::is_first_claim`]): there is no
    /// record, no earlier attempt that could write one, and the attempt's first progress write
    /// makes it (a job that ends before that write never has one). Idempotent per
    /// execution: if this execution already holds the job (the claim's response was lost and
    /// the state machine retried it), the existing lease is returned and the hand-over is
    /// done again — the first call may have died between the two writes. If nothing retries
    /// it, the reaper judges the lease by its claim time: no hand-over, no heartbeat.
    ///
    /// A `claimant` (a direct run's: [`crate::runs`]) is stored with the claim, and only the
    /// same claimant gets the lease back: Lambda's retry of the invocation carries it, a second
    /// invocation of the same run (a redelivered dispatch) does not, and is refused. A claim
    /// without one (an execution's) gets it back only once no run holds the job: an execution
    /// takes a direct run's job over under the run's name after [`Self::record_execution`]
    /// ended the run's hold ([`JobRecord::holds_claim`]).
    pub async fn claim_as(
        &self,
        job_id: &JobId,
        execution: &str,
        claimant: Option<&str>,
    ) -> Result<(Lease, JobView), StoreError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut request = TransitionRequest::new(
            job_id,
            &[JobStatus::Queued],
            JobStatus::Running,
            "claimed by a stage",
        )
        .set("lease", &token);
        if let Some(claimant) = claimant {
            request = request.set("claimant", claimant);
        }
        match self.claim_update(request, execution).await {
            Ok(job) if job.is_first_claim() => {
                // Nothing to hand over: the attempt's first progress write makes the record.
                let lease = Lease { attempt: job.attempt, token };
                Ok((lease, JobView { job, progress: None }))
            }
            Ok(job) => {
                let lease = Lease { attempt: job.attempt, token };
                let progress = self.take_progress(job_id, &lease).await?;
                Ok((lease, JobView { job, progress: Some(progress) }))
            }
            Err(StoreError::Conflict { current: Some(job) })
                if job.holds_claim(execution, claimant) =>
            {
                let lease =
                    Lease { attempt: job.attempt, token: job.lease.clone().unwrap_or_default() };
                let progress = self.take_progress(job_id, &lease).await?;
                Ok((lease, JobView { job: *job, progress: Some(progress) }))
            }
            Err(err) => Err(err),
        }
    }

    /// The claim's write: only the execution the job was last dispatched to may claim it (a
    /// late start of a superseded one — the reaper re-dispatched the job, or a backoff named
    /// the next attempt's execution — must not run it beside the current one).
    pub(super) async fn claim_update(
        &self,
        request: TransitionRequest,
        execution: &str,
    ) -> Result<JobRecord, StoreError> {
        // The claim is a transition that also counts the attempt and stamps the first start.
        let at = Timestamp::now();
        let now = at.to_rfc3339();
        let mut names = HashMap::from([
            ("#status".to_owned(), "status".to_owned()),
            ("#attempt".to_owned(), "attempt".to_owned()),
        ]);
        let mut values = HashMap::from([
            (":to".to_owned(), s(request.to.as_str())),
            (":from".to_owned(), s(JobStatus::Queued.as_str())),
            (":now".to_owned(), s(&now)),
            (":one".to_owned(), AttributeValue::N("1".into())),
            (":t".to_owned(), transition_value(request.to, &request.reason, at)),
            (":execution".to_owned(), s(execution)),
        ]);
        let mut update = String::from(
            "SET #status = :to, updated_at = :now, started_at = if_not_exists(started_at, :now), \
             transitions = list_append(transitions, :t)",
        );
        // A claim without a claimant (an execution's) removes any a run of an earlier attempt
        // left: the job is this execution's alone (`JobRecord::holds_claim`).
        let claimless =
            if request.set.iter().any(|(name, _)| name == "claimant") { "" } else { ", claimant" };
        for (i, (name, value)) in request.set.into_iter().enumerate() {
            update.push_str(&format!(", #s{i} = :s{i}"));
            names.insert(format!("#s{i}"), name);
            values.insert(format!(":s{i}"), transition::attribute_value(value));
        }
        // The claimed job enters the running bucket in this same write: if the claim dies
        // before handing the progress record over, the reaper still finds the job.
        // A job back from a backoff no longer waits for its `retry_at`.
        // It leaves its owner's backlog: it runs.
        update.push_str(&format!(
            ", gsi2pk = :bucket, gsi2sk = :now ADD #attempt :one REMOVE retry_at, {BACKLOG_INDEX_PK}{claimless}"
        ));
        values.insert(
            ":bucket".to_owned(),
            s(status_bucket(JobStatus::Running.as_str(), &request.job_id)),
        );
        let condition = "#status = :from AND execution = :execution".into();
        self.update_job(&request.job_id, update, condition, names, values).await
    }

    /// Sets (or clears) the job's `stalled_at` while it runs under `lease`. Refused
    /// ([`StoreError::Conflict`]) if it is already set (or already clear), so of two reapers
    /// that saw the same stall only one flags it and counts it.
    pub async fn mark_stalled(
        &self,
        job_id: &JobId,
        lease: &str,
        stalled_at: Option<&str>,
    ) -> Result<(), StoreError> {
        match stalled_at {
            Some(at) => {
                let values = HashMap::from([(":at".to_owned(), s(at))]);
                self.update_fenced_when(
                    job_id,
                    lease,
                    "SET stalled_at = :at",
                    Some("attribute_not_exists(stalled_at)"),
                    values,
                )
                .await?
            }
            None => {
                self.update_fenced_when(
                    job_id,
                    lease,
                    "REMOVE stalled_at",
                    Some("attribute_exists(stalled_at)"),
                    HashMap::new(),
                )
                .await?
            }
        };
        Ok(())
    }

    /// Takes back a retry's claim to resume (`resumed_from`): its attempt found the retried
    /// job's checkpoint unusable and starts over, so the job no longer says it resumed.
    /// Fenced by the attempt's lease; nothing to do if the record says no resume.
    pub async fn forget_resume(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        let result = self
            .update_fenced_when(
                job_id,
                lease,
                "REMOVE resumed_from",
                Some("attribute_exists(resumed_from)"),
                HashMap::new(),
            )
            .await;
        match result {
            Ok(_) => Ok(()),
            // Already said (an earlier invocation of the attempt took it back).
            Err(StoreError::Conflict { current: Some(job) })
                if job.resumed_from.is_none()
                    && job.status == JobStatus::Running
                    && job.lease.as_deref() == Some(lease) =>
            {
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    /// Counts one more dispatch of a `pending` job (the reaper re-enqueueing it), moves its
    /// status-index entry to `index_key` (when the reaper should look again) and returns the
    /// record; refused if the job moved on meanwhile.
    pub async fn count_enqueue(
        &self,
        job_id: &JobId,
        index_key: &str,
    ) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":pending".to_owned(), s(JobStatus::Pending.as_str())),
            (":one".to_owned(), AttributeValue::N("1".into())),
            (":now".to_owned(), s(now_rfc3339())),
            (":look".to_owned(), s(index_key)),
        ]);
        self.update_job(
            job_id,
            "SET updated_at = :now, gsi2sk = :look ADD enqueues :one".into(),
            "#status = :pending".into(),
            names,
            values,
        )
        .await
    }

    /// Records that a `pending` job waits for a running slot (`waiting`) and moves its
    /// status-index entry to the `waiting` bucket, where the reaper reconciles the pools of
    /// waiting jobs rather than re-enqueueing them as lost; refused if the job moved on.
    pub async fn mark_waiting(
        &self,
        job_id: &JobId,
        waiting: &Waiting,
    ) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":pending".to_owned(), s(JobStatus::Pending.as_str())),
            (":now".to_owned(), s(now_rfc3339())),
            (
                ":waiting".to_owned(),
                serde_dynamo::to_attribute_value(waiting).expect("a wait always serialises"),
            ),
            (":bucket".to_owned(), s(status_bucket(WAITING_BUCKET, job_id))),
            (":since".to_owned(), s(waiting.since.to_rfc3339())),
        ]);
        self.update_job(
            job_id,
            "SET updated_at = :now, waiting = :waiting, gsi2pk = :bucket, gsi2sk = :since".into(),
            "#status = :pending".into(),
            names,
            values,
        )
        .await
    }

    /// Moves a `pending` job's status-index entry to `index_key` (when the reaper should look
    /// at it next: a delayed job's start); refused if the job moved on meanwhile.
    pub async fn defer_pending_look(
        &self,
        job_id: &JobId,
        index_key: &str,
    ) -> Result<(), StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":pending".to_owned(), s(JobStatus::Pending.as_str())),
            (":look".to_owned(), s(index_key)),
        ]);
        self.update_job(
            job_id,
            "SET gsi2sk = :look".into(),
            "#status = :pending".into(),
            names,
            values,
        )
        .await
        .map(|_| ())
    }

    /// Points a `queued` job whose execution ended without running it at a new execution
    /// (dispatch number `dispatch`, named `execution`); refused if someone else did first.
    pub async fn redispatch_queued(
        &self,
        job_id: &JobId,
        seen_dispatches: u32,
        execution: &str,
    ) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":queued".to_owned(), s(JobStatus::Queued.as_str())),
            (":seen".to_owned(), AttributeValue::N(seen_dispatches.to_string())),
            (":next".to_owned(), AttributeValue::N((seen_dispatches + 1).to_string())),
            (":execution".to_owned(), s(execution)),
            (":now".to_owned(), s(now_rfc3339())),
        ]);
        self.update_job(
            job_id,
            "SET execution = :execution, dispatches = :next, updated_at = :now, gsi2sk = :now"
                .into(),
            if seen_dispatches == 0 {
                "#status = :queued AND (attribute_not_exists(dispatches) OR dispatches = :seen)"
                    .into()
            } else {
                "#status = :queued AND dispatches = :seen".into()
            },
            names,
            values,
        )
        .await
    }

    /// Marks an expired job's records for DynamoDB TTL (epoch seconds) and takes the job out
    /// of the status index (its `expired#<shard>` entry): the last step of expiring a job, so
    /// the entry stays until everything before it is done. The progress record goes first.
    pub async fn retain_until(&self, job_id: &JobId, epoch_seconds: i64) -> Result<(), StoreError> {
        for sk in [PROGRESS_SK, JOB_SK] {
            let result = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(job_pk(job_id)))
                .key("sk", s(sk))
                .update_expression("SET expires_at = :ttl REMOVE gsi2pk, gsi2sk")
                .condition_expression("attribute_exists(pk)")
                .expression_attribute_values(":ttl", AttributeValue::N(epoch_seconds.to_string()))
                .send()
                .await;
            match result {
                Ok(_) => {}
                Err(err) if crate::condition_refused(&err) => {}
                Err(err) => {
                    return Err(AwsError::new(format!("set retention of {job_id}"), err).into());
                }
            }
        }
        Ok(())
    }

    /// Counts one continuation of the job's execution (fenced) and returns the new count,
    /// which names the next execution.
    pub async fn count_continuation(&self, job_id: &JobId, lease: &str) -> Result<u32, StoreError> {
        Ok(self.count_fenced(job_id, lease, "continuations").await?.continuations)
    }

    /// Records that the attempt holding `lease` goes on in execution `name` (a continuation):
    /// whoever stops the job's execution (the reaper, ending or re-dispatching it) must stop
    /// the one that runs it now, not the one it continued from.
    pub async fn record_execution(
        &self,
        job_id: &JobId,
        lease: &str,
        name: &str,
    ) -> Result<JobRecord, StoreError> {
        let values = HashMap::from([
            (":execution".to_owned(), s(name)),
            (":now".to_owned(), s(now_rfc3339())),
        ]);
        self.update_fenced(
            job_id,
            lease,
            "SET updated_at = :now, execution = :execution REMOVE claimant",
            values,
        )
        .await
    }

    /// Counts one injected failure of a diagnostic kind, fenced by the lease (so it survives
    /// the retry that follows and a stale attempt cannot count).
    pub async fn count_injected_failure(
        &self,
        job_id: &JobId,
        lease: &str,
    ) -> Result<JobRecord, StoreError> {
        self.count_fenced(job_id, lease, "injected_failures").await
    }
}
