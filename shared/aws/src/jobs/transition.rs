//! A status change as one conditional write.

use super::*;

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_domain::JobStatus;

/// A conditional status change.
#[derive(Debug, Clone)]
pub struct TransitionRequest {
    /// The job.
    pub job_id: JobId,
    /// Statuses the job may be in for the change to apply.
    pub from: Vec<JobStatus>,
    /// The new status.
    pub to: JobStatus,
    /// Why, for the transition log.
    pub reason: String,
    /// When set, the change applies only while this lease holds.
    pub fence: Option<String>,
    /// Further attributes of the record to set in the same write, as their serialised values.
    pub set: Vec<(String, serde_json::Value)>,
    /// The status index's sort key for the new status (default: now); for `succeeded` it is
    /// when the result expires.
    pub index_at: Option<String>,
    /// When set (a time as stored), the change applies only to a job without a `not_before`
    /// or whose `not_before` is not later: a delayed job is not dispatched early.
    pub due_at: Option<String>,
    /// Attributes removed in the same write.
    pub remove: Vec<String>,
    /// When set, the change applies only to a job its owner has not asked to cancel: an
    /// attempt's end that would hide the request (a retry, a failure) is refused, and the
    /// caller ends the job `cancelled` instead.
    pub unless_cancelled: bool,
    /// When set (the record's `updated_at` as it was read), the change applies only if nothing
    /// wrote the record since: for a change computed from what was read.
    pub unchanged_since: Option<Timestamp>,
    /// Attributes the record must have for the change to apply.
    pub requires: Vec<String>,
    /// Attributes the record must not have for the change to apply.
    pub lacks: Vec<String>,
    /// When set, the change applies only to a job that would not compensate first: one that
    /// has not started, or whose kind gave it no undo ([`JobRecord::wants_compensation`]).
    pub unless_compensable: bool,
}

impl TransitionRequest {
    /// A change from any of `from` to `to`.
    pub fn new(
        job_id: &JobId,
        from: &[JobStatus],
        to: JobStatus,
        reason: impl Into<String>,
    ) -> Self {
        TransitionRequest {
            job_id: job_id.to_owned(),
            from: from.to_vec(),
            to,
            reason: reason.into(),
            fence: None,
            set: Vec::new(),
            index_at: None,
            due_at: None,
            remove: Vec::new(),
            unless_cancelled: false,
            unchanged_since: None,
            requires: Vec::new(),
            lacks: Vec::new(),
            unless_compensable: false,
        }
    }

    /// Applies only to a job that would not compensate first (see
    /// [`TransitionRequest::unless_compensable`]).
    pub fn unless_compensable(mut self) -> Self {
        self.unless_compensable = true;
        self
    }

    /// Applies only if the record has no attribute `name`.
    pub fn lacks(mut self, name: &str) -> Self {
        self.lacks.push(name.to_owned());
        self
    }

    /// Applies only if the record has attribute `name`.
    pub fn requires(mut self, name: &str) -> Self {
        self.requires.push(name.to_owned());
        self
    }

    /// Applies only if the record was not written since it was read with `updated_at`.
    pub fn unchanged_since(mut self, updated_at: Timestamp) -> Self {
        self.unchanged_since = Some(updated_at);
        self
    }

    /// Applies only if the job's owner has not asked to cancel it (see
    /// [`TransitionRequest::unless_cancelled`]).
    pub fn unless_cancelled(mut self) -> Self {
        self.unless_cancelled = true;
        self
    }

    /// Also removes attribute `name`.
    pub fn remove(mut self, name: &str) -> Self {
        self.remove.push(name.to_owned());
        self
    }

    /// Applies only if the job's `not_before` (if any) is not later than `now`.
    pub fn due(mut self, now: &str) -> Self {
        self.due_at = Some(now.to_owned());
        self
    }

    /// Indexes the job under `at` in its new status (see [`TransitionRequest::index_at`]).
    pub fn indexed_at(mut self, at: String) -> Self {
        self.index_at = Some(at);
        self
    }

    /// Applies only while `lease` holds the job.
    pub fn fenced(mut self, lease: &str) -> Self {
        self.fence = Some(lease.to_owned());
        self
    }

    /// Also sets the record's attribute `name` to `value`.
    pub fn set(mut self, name: &str, value: impl serde::Serialize) -> Self {
        let value = serde_json::to_value(value).expect("record attributes serialise");
        self.set.push((name.to_owned(), value));
        self
    }
}

/// A value of [`TransitionRequest::set`] as DynamoDB stores it.
pub(super) fn attribute_value(value: serde_json::Value) -> AttributeValue {
    serde_dynamo::to_attribute_value(value).expect("JSON values are attribute values")
}

impl JobStore {
    /// Applies a conditional status change and returns the record as it is afterwards. A failed
    /// condition comes back as [`StoreError::Conflict`] with the record as it is now (read in
    /// the same request, never a second round trip).
    pub async fn transition(&self, request: TransitionRequest) -> Result<JobRecord, StoreError> {
        for from in &request.from {
            from.transition(request.to)?;
        }
        let at = Timestamp::now();
        let now = at.to_rfc3339();
        let mut update = String::from(
            "SET #status = :to, updated_at = :now, transitions = list_append(transitions, :t)",
        );
        let mut names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let mut values = HashMap::from([
            (":to".to_owned(), s(request.to.as_str())),
            (":now".to_owned(), s(&now)),
            (":t".to_owned(), transition_value(request.to, &request.reason, at)),
        ]);
        if request.to.is_terminal() {
            update.push_str(", finished_at = :now");
        }
        // A job that ends for good gets its TTL in the write that ends it: no follow-up write
        // to lose. (A succeeded job's records get theirs when its result expires.)
        if matches!(request.to, JobStatus::Failed | JobStatus::Cancelled | JobStatus::Expired) {
            update.push_str(", expires_at = :ttl");
            values.insert(":ttl".into(), self.retention.ttl_from_now());
        }
        for (i, (name, value)) in request.set.into_iter().enumerate() {
            update.push_str(&format!(", #s{i} = :s{i}"));
            names.insert(format!("#s{i}"), name);
            values.insert(format!(":s{i}"), attribute_value(value));
        }
        let mut removed: Vec<String> = Vec::new();
        // Out of its owner's backlog once it runs or ends (a job back in `queued` after an
        // attempt has run: it ran). A job paused before it ran stays in it: paused and resumed,
        // it is still a job its tenant submitted and that has not run.
        if !matches!(request.to, JobStatus::Pending | JobStatus::Queued | JobStatus::Paused) {
            removed.push(BACKLOG_INDEX_PK.to_owned());
        }
        for (i, name) in request.remove.into_iter().enumerate() {
            removed.push(format!("#r{i}"));
            names.insert(format!("#r{i}"), name);
        }
        // The status index holds only what the reaper and the expirer look for (a `paused` job
        // under the time its pause lapses, a resumed `pending` one under its resume, a
        // `compensating` one under when its worker should next be heard of). An expired
        // job stays (in `expired#<shard>`) until the expirer has deleted its objects and
        // marked its progress record ([`JobStore::retain_until`] takes it out): a run that
        // dies in between leaves the rest to the next run.
        match (request.to, request.index_at) {
            (
                JobStatus::Pending
                | JobStatus::Queued
                | JobStatus::Running
                | JobStatus::Paused
                | JobStatus::Compensating
                | JobStatus::Succeeded
                | JobStatus::Expired,
                at,
            ) => {
                update.push_str(", gsi2pk = :bucket, gsi2sk = :index_at");
                values.insert(
                    ":bucket".into(),
                    s(status_bucket(request.to.as_str(), &request.job_id)),
                );
                values.insert(":index_at".into(), s(at.unwrap_or_else(|| now.clone())));
            }
            _ => removed.extend(["gsi2pk".to_owned(), "gsi2sk".to_owned()]),
        }
        if !removed.is_empty() {
            update.push_str(&format!(" REMOVE {}", removed.join(", ")));
        }
        let from: Vec<String> = request
            .from
            .iter()
            .enumerate()
            .map(|(i, status)| {
                values.insert(format!(":from{i}"), s(status.as_str()));
                format!(":from{i}")
            })
            .collect();
        let mut condition = format!("#status IN ({})", from.join(", "));
        if let Some(lease) = request.fence {
            condition.push_str(" AND #lease = :lease");
            names.insert("#lease".into(), "lease".into());
            values.insert(":lease".into(), s(lease));
        }
        if request.unless_cancelled {
            condition.push_str(" AND attribute_not_exists(cancellation)");
        }
        if request.unless_compensable {
            // `undo_stages` is stored only when not empty.
            condition.push_str(
                " AND (attribute_not_exists(undo_stages) OR attribute_not_exists(started_at))",
            );
        }
        for (i, name) in request.requires.iter().enumerate() {
            condition.push_str(&format!(" AND attribute_exists(#q{i})"));
            names.insert(format!("#q{i}"), name.clone());
        }
        for (i, name) in request.lacks.iter().enumerate() {
            condition.push_str(&format!(" AND attribute_not_exists(#n{i})"));
            names.insert(format!("#n{i}"), name.clone());
        }
        if let Some(read) = request.unchanged_since {
            condition.push_str(" AND updated_at = :read");
            values.insert(":read".into(), s(read.to_rfc3339()));
        }
        if let Some(now) = request.due_at {
            // Stored timestamps share one format, so they compare as strings.
            condition.push_str(" AND (attribute_not_exists(not_before) OR not_before <= :due)");
            values.insert(":due".into(), s(now));
        }
        self.update_job(&request.job_id, update, condition, names, values).await
    }
}
