//! Idempotent creation: the job's key claimed, the tenant charged, the record written once,
//! and every request that finds the key taken answered for the job it names.

use std::time::Duration;

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Response};
use longhaul_aws::api::Problem;
use longhaul_aws::jobs::{IdempotencyRecord, JobRecord, ProgressRecord, ScheduledBy, StoreError};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_domain::admission::Priority;
use longhaul_domain::fingerprint::is_derived_key;
use longhaul_domain::{JobId, JobStatus, Owner, Timestamp};
use longhaul_worker::DynKind;

use crate::Deps;
use crate::limits::{charge, rate_limited, within_backlog};
use crate::record::new_job;
use crate::response::{accepted, internal};
use crate::start::{Seat, seat, start};
use crate::submission::uploads_present;

/// How long a claimed idempotency key whose job record is not written yet counts as "the
/// original request is still being processed" (→ `409`). After it, the claimant is taken for
/// dead and the next request with the key finishes the creation. A key whose job record
/// exists is never in flight, however young the job: the replay answers `200` with it.
pub const IN_FLIGHT_WINDOW: Duration = Duration::from_secs(10);

/// A submission accepted: the job it created, or (`replay`) the one its key already named.
#[derive(Debug)]
pub struct Accepted {
    /// The job.
    pub job: JobRecord,
    /// Whether an earlier request with the key made it (`200`, not `202`).
    pub replay: bool,
}

impl Accepted {
    /// The HTTP answer: `202` with the new job, or `200` with the replayed one.
    pub(crate) fn into_response(self) -> Response<Body> {
        let status = if self.replay { StatusCode::OK } else { StatusCode::ACCEPTED };
        accepted(status, &self.job, self.replay)
    }
}

/// What a submission asks for, validated.
pub(crate) struct NewJob<'a> {
    pub(crate) owner: &'a Owner,
    pub(crate) kind: &'a dyn DynKind,
    pub(crate) params: &'a serde_json::Value,
    pub(crate) callback_url: &'a Option<String>,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: &'a str,
    pub(crate) retry_of: Option<&'a JobId>,
    /// A delayed start (as stored), or `None` to start at once.
    pub(crate) not_before: Option<Timestamp>,
    /// Its order among the owner's waiting jobs.
    pub(crate) priority: Priority,
    /// A retry from the retried job's last checkpoint: that job, and its progress record.
    pub(crate) resume: Option<(JobId, ProgressRecord)>,
    /// The uploads its params read (each one of the owner's), checked to exist only by the
    /// request that creates the job ([`uploads_present`]).
    pub(crate) inputs: &'a [String],
    /// The schedule tick that submits it, if one does.
    pub(crate) scheduled: Option<ScheduledBy>,
}

/// A retry that resumes gets, once it holds its idempotency key and before its record is
/// written (and so before it can be dispatched), the progress record of the job it retries
/// (`JobCreation::seed_progress`). If that write fails, it runs from the start, and its record
/// says so (no `resumed_from`). Seeded only by the request that writes the job: a request that
/// finds the key taken seeds nothing (a seed for a job never written would be an orphan).
async fn resumable(deps: &Deps, mut job: JobRecord, new: &NewJob<'_>) -> JobRecord {
    if let Some((from, progress)) = &new.resume
        && let Err(err) = deps.jobs.seed_progress(&job.job_id, progress).await
    {
        tracing::warn!(error = %err, retry_of = from.as_str(), "seeding the retry's progress failed; it runs from the start");
        job.resumed_from = None;
    }
    job
}

/// Creates the job under its idempotency key, or answers for the job the key already names.
///
/// Two conditional writes, no transaction: (1) claim the key for a fresh job id, (2) write
/// the job under that id. The request that claimed the key charges the tenant's submission
/// rate between the two, so a written job record means its creator is past every point where
/// it could refuse: what it answers is settled (`202` with that job; starting it cannot change
/// it, see [`start`]). That record is the only mark "the original request is done" needs:
/// a request that finds the key taken answers `200` with the job as soon as the job record
/// exists ([`KeyTaken::Replay`]), and `409` only while it does not ([`KeyTaken::InFlight`]).
/// A claim older than [`IN_FLIGHT_WINDOW`] without its job was left by a request that died
/// between its writes: the next request with the same key finishes the creation itself with
/// the recorded id. The job write is conditional, so however many requests race, one job is
/// written and only its writer starts it and answers `202`.
///
/// Only the request that claimed the key (or finishes a claim left behind) is charged: a key
/// that already names a live record (a replay, a conflicting reuse, a request in flight) is
/// answered without counting, and a refused submission gives its claim back and writes
/// nothing else.
pub(crate) async fn create(deps: &Deps, new: &NewJob<'_>) -> Result<Accepted, Problem> {
    let mut replacing: Option<JobId> = None;
    // A reused key races at most a few times (another request replacing the same failed job).
    for _ in 0..4 {
        let job = new_job(deps, new, JobId::new());
        logs::current_job(&job);
        let record = IdempotencyRecord {
            job_id: job.job_id.clone(),
            fingerprint: new.fingerprint.to_owned(),
            created_at: job.created_at,
            expires_at: job.created_at.as_datetime().timestamp()
                + deps.idempotency_ttl.as_secs() as i64,
        };
        let existing =
            match deps.jobs.claim_key(new.owner, new.key, &record, replacing.as_ref()).await {
                Ok(()) => return create_claimed(deps, new, job).await,
                Err(StoreError::KeyTaken(existing)) => existing,
                Err(StoreError::Conflict { .. }) => {
                    replacing = None; // the record we meant to replace expired: claim afresh
                    continue;
                }
                Err(err) => return Err(internal(err)),
            };
        if existing.fingerprint != new.fingerprint {
            return Err(Problem::unprocessable(
                "idempotency-key-reused",
                "Idempotency-Key reused with a different request",
                "This Idempotency-Key was used for a different request; use a new key.",
            ));
        }
        logs::record_job_id(&tracing::Span::current(), &existing.job_id);
        let found = deps.jobs.job(&existing.job_id).await.map_err(internal)?;
        let claimed_recently = is_recent(existing.created_at, deps.clock.now().into());
        match key_taken(new.key, found, claimed_recently) {
            KeyTaken::InFlight => return Err(in_flight()),
            KeyTaken::Replay(job) => {
                logs::current_job(&job);
                return Ok(Accepted { job: *job, replay: true });
            }
            KeyTaken::Replace(job_id) => replacing = Some(job_id),
            KeyTaken::Abandoned => {
                // The request that claimed the key never wrote its job: finish it.
                // The key's record names the job and its creation time (an unreadable id is
                // a corrupt record, not a default).
                let corrupt = |err: &dyn std::fmt::Display| {
                    tracing::error!(error = %err, "an unreadable idempotency record");
                    Problem::internal()
                };
                let job_id = existing.job_id.parse().map_err(|e| corrupt(&e))?;
                // Admitted as the request that claimed the key would have been (it may have
                // died before its checks): its uploads, the tenant's backlog and its rate.
                // Refused, the claim stays, and the next request finds it again.
                uploads_present(deps, new.inputs).await?;
                within_backlog(deps, new.owner).await?;
                charge(deps, new.owner).await?;
                let mut job = resumable(deps, new_job(deps, new, job_id), new).await;
                job.created_at = existing.created_at;
                logs::current_job(&job);
                match deps.jobs.put_job(&job).await {
                    Ok(()) => {
                        tracing::info!(
                            job_type = job.job_type,
                            "submitted (finishing an interrupted request)"
                        );
                        start(deps, &job).await;
                        return Ok(Accepted { job, replay: false });
                    }
                    Err(StoreError::Conflict { .. }) => continue, // another request finished it
                    Err(err) => return Err(internal(err)),
                }
            }
        }
    }
    Err(in_flight())
}

/// What a request that found its idempotency key taken (by a record with its own
/// fingerprint) does, decided by what the key's creation has written — never by how far the
/// job has got, beyond the statuses that free a key.
#[derive(Debug, PartialEq)]
enum KeyTaken {
    /// The key is claimed but its job not written yet, and the claim is younger than
    /// [`IN_FLIGHT_WINDOW`]: the original request is still being processed (`409`).
    InFlight,
    /// The key is claimed, its job was never written and the claim is older than
    /// [`IN_FLIGHT_WINDOW`]: its request died between its writes; this one finishes it.
    Abandoned,
    /// The key's job ended in a way that frees the key: a new job replaces it.
    Replace(JobId),
    /// The key's job exists: the original request's answer is settled, and this one is
    /// answered with the job (`200`, `Idempotent-Replayed: true`), whatever its status — a
    /// `pending` one included, even one its creator died before starting (the reaper
    /// enqueues it after `LONGHAUL_PENDING_GRACE_SECONDS`, as it does when starting fails).
    Replay(Box<JobRecord>),
}

/// Decides [`KeyTaken`] from the key's job as read (`None`: not written) and whether the
/// key's claim is younger than [`IN_FLIGHT_WINDOW`].
fn key_taken(key: &str, job: Option<JobRecord>, claimed_recently: bool) -> KeyTaken {
    match job {
        None if claimed_recently => KeyTaken::InFlight,
        None => KeyTaken::Abandoned,
        // A tick's key names the tick's one job for good, however it ended: a firing retried
        // after its job failed must not make a second job for the same tick.
        Some(job) if job.scheduled.is_some() => KeyTaken::Replay(Box::new(job)),
        Some(job) => match job.status {
            JobStatus::Failed | JobStatus::Cancelled => KeyTaken::Replace(job.job_id),
            // A derived key stands for "this request": once its job's result expired, the
            // request runs again. A client's own key keeps naming its job.
            JobStatus::Expired if is_derived_key(key) => KeyTaken::Replace(job.job_id),
            JobStatus::Pending
            | JobStatus::Queued
            | JobStatus::Running
            | JobStatus::Paused
            | JobStatus::Compensating
            | JobStatus::Succeeded
            | JobStatus::Expired => KeyTaken::Replay(Box::new(job)),
        },
    }
}

/// Creates the job whose key this request has just claimed: checks that its uploads exist,
/// takes its running slots ([`seat`]; its tenant pool's write counts the submission too),
/// checks its tenant's backlog (only a job that must wait for a slot adds to it), charges the
/// tenant's submission rate unless the seat did, seeds a resumed retry's
/// progress, writes the job record (`queued` when seated, else `pending`), starts it and
/// answers `202`.
///
/// The checks and the charge come before the job's write, not beside it: once the job record
/// exists, requests with the same key answer with it ([`KeyTaken::Replay`]), so it must not
/// be written by a request that may still be refused. Refused, the request gives its slots
/// and its claim back (the claim only if it still names this request's job; neither once it
/// is past [`IN_FLIGHT_WINDOW`], when another request may have finished the creation) and has
/// written nothing else. They come after the claim, so that a replay (which finds the key taken)
/// answers as the original did without them: no HEAD of an upload it no longer needs, which
/// may be gone by then.
async fn create_claimed(
    deps: &Deps,
    new: &NewJob<'_>,
    job: JobRecord,
) -> Result<Accepted, Problem> {
    let admitted = async {
        uploads_present(deps, new.inputs).await?;
        let (seated, charged) = match seat(deps, &job).await {
            Seat::Seated(seated, charged) => (Some(seated), charged),
            Seat::Unseated => (None, false),
            // Refused by the write that would have seated it: nothing taken, nothing counted.
            Seat::Limited { retry_after } => return Err(rate_limited(retry_after)),
        };
        let limits = async {
            if seated.is_none() {
                within_backlog(deps, new.owner).await?;
            }
            if !charged {
                charge(deps, new.owner).await?;
            }
            Ok(())
        };
        match (limits.await, seated) {
            (Ok(()), seated) => Ok(seated),
            (Err(refused), seated) => {
                if let Some(seated) = seated
                    && is_recent(job.created_at, deps.clock.now().into())
                {
                    seated.unseat(&job).await;
                }
                Err(refused)
            }
        }
    }
    .await;
    let seated = match admitted {
        Ok(seated) => seated,
        Err(refused) => {
            // Past `IN_FLIGHT_WINDOW`, another request may have finished this creation (the
            // same job id, written and started): its key and slots are that job's now. Left
            // as they are, a key whose job was never written is finished by the next request
            // with it, and a slot held for no job comes back with the reaper.
            if is_recent(job.created_at, deps.clock.now().into()) {
                deps.jobs.release_key(new.owner, new.key, &job.job_id).await.map_err(internal)?;
            }
            return Err(refused);
        }
    };
    let job = resumable(deps, job, new).await;
    let job = &match &seated {
        Some(seated) => seated.dispatched(job),
        None => job,
    };
    match deps.jobs.put_job(job).await {
        Ok(()) => {
            metrics::count(Metric::JobsSubmitted, job);
            // Never the params, the callback URL or the idempotency key (see `longhaul_aws::logs`).
            tracing::info!(
                job_type = job.job_type,
                retry_of = job.retry_of.as_ref().map(JobId::as_str),
                status = %job.status,
                "submitted"
            );
            match seated {
                Some(seated) => seated.start(deps, job).await,
                None => start(deps, job).await,
            }
            Ok(Accepted { job: job.clone(), replay: false })
        }
        // A fresh UUIDv7 is taken only when this request stalled past `IN_FLIGHT_WINDOW`
        // between its writes and another request with the key finished the creation (and
        // started the job): answered as that request's replay. Slots this request took are
        // that job's (a slot's holder is the job id): they are settled by how it stands.
        Err(StoreError::Conflict { .. }) => match deps.jobs.job(&job.job_id).await {
            Ok(Some(written)) => {
                logs::current_job(&written);
                if let Some(seated) = seated {
                    seated.settle(deps, &written).await;
                }
                Ok(Accepted { job: written, replay: true })
            }
            Ok(None) => {
                tracing::error!("the job record this request's write collided with is gone");
                Err(Problem::internal())
            }
            Err(err) => Err(internal(err)),
        },
        // The write may have applied all the same (a timeout): the slots stay, and if no job
        // was written, the reaper gives them back (`UNWRITTEN_HOLDER_GRACE`).
        Err(err) => Err(internal(err)),
    }
}

fn in_flight() -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "request-in-flight",
        "The original request is still in progress",
        "A request with this Idempotency-Key is still being processed; retry shortly.",
    )
    .header(header::RETRY_AFTER, "1")
}

/// Whether a key claimed at `created_at` is still within [`IN_FLIGHT_WINDOW`] at `now`.
fn is_recent(created_at: Timestamp, now: Timestamp) -> bool {
    now.since(created_at) < IN_FLIGHT_WINDOW
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::job_in;
    use longhaul_domain::fingerprint::derived_idempotency_key;

    fn replayed(decision: KeyTaken) -> JobRecord {
        match decision {
            KeyTaken::Replay(job) => *job,
            other => panic!("not a replay: {other:?}"),
        }
    }

    #[test]
    fn a_written_job_is_replayed_however_young_even_pending() {
        // The first request wrote its job and may not have enqueued it yet (or died before
        // it): the job exists, so the answer is the job, not "still in progress".
        for recently in [true, false] {
            let job = job_in(JobStatus::Pending);
            assert_eq!(replayed(key_taken("order-42", Some(job.clone()), recently)), job);
        }
        for status in [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded] {
            let job = job_in(status);
            assert_eq!(replayed(key_taken("order-42", Some(job.clone()), true)), job);
        }
    }

    #[test]
    fn only_a_claim_without_its_job_is_in_flight_and_only_for_the_window() {
        assert_eq!(key_taken("order-42", None, true), KeyTaken::InFlight);
        assert_eq!(key_taken("order-42", None, false), KeyTaken::Abandoned);
        let now = Timestamp::now();
        let young = now;
        assert!(is_recent(young, now));
        let old: Timestamp = (now.as_datetime()
            - chrono::Duration::from_std(IN_FLIGHT_WINDOW).unwrap()
            - chrono::Duration::seconds(1))
        .into();
        assert!(!is_recent(old, now));
    }

    #[test]
    fn a_failed_cancelled_or_derived_expired_job_frees_its_key() {
        for status in [JobStatus::Failed, JobStatus::Cancelled] {
            let job = job_in(status);
            assert_eq!(
                key_taken("order-42", Some(job.clone()), true),
                KeyTaken::Replace(job.job_id)
            );
        }
        let expired = job_in(JobStatus::Expired);
        let derived = derived_idempotency_key(&"alice".parse().unwrap(), "f");
        assert_eq!(
            key_taken(&derived, Some(expired.clone()), false),
            KeyTaken::Replace(expired.job_id.clone())
        );
        // A client's own key keeps naming its job.
        assert_eq!(replayed(key_taken("order-42", Some(expired.clone()), false)), expired);
    }

    #[test]
    fn in_flight_is_a_409_with_retry_after() {
        let problem = in_flight().into_response();
        assert_eq!(problem.status(), StatusCode::CONFLICT);
        assert_eq!(problem.headers()[header::RETRY_AFTER], "1");
    }
}
