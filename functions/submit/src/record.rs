//! The record a new job is written as: its kind, params and callback, its stored policy, and
//! the marks of a retry.

use longhaul_aws::jobs::{JobRecord, ResumedFrom};
use longhaul_domain::policy::{JobPolicy, PolicyOverrides};
use longhaul_domain::{JobId, JobStatus, Timestamp, Transition};
use longhaul_worker::DynKind;

use crate::Deps;
use crate::create::NewJob;

/// The policy stored on a new job of `kind`: the kind's, with the deployment's overrides.
pub fn stored_policy(kind: &dyn DynKind, overrides: &PolicyOverrides) -> JobPolicy {
    // The worker API's `Policy` serialises to the stored shape (it is what GET /job-types shows).
    let value = serde_json::to_value(kind.policy()).expect("a policy always serialises");
    let policy = serde_json::from_value(value).expect("a kind's policy is a stored policy");
    overrides.apply(kind.name(), policy)
}

pub(crate) fn new_job(deps: &Deps, new: &NewJob<'_>, job_id: JobId) -> JobRecord {
    let now = Timestamp::from(deps.clock.now());
    JobRecord {
        job_id,
        owner: new.owner.clone(),
        job_type: new.kind.name().to_owned(),
        params: new.params.clone(),
        status: JobStatus::Pending,
        attempt: 0,
        lease: None,
        execution: None,
        claimant: None,
        ended_at_stage: None,
        idempotency_key: new.key.to_owned(),
        fingerprint: new.fingerprint.to_owned(),
        callback_url: new.callback_url.clone(),
        created_at: now,
        updated_at: now,
        started_at: None,
        finished_at: None,
        error: None,
        result_key: None,
        result_inline: None,
        transitions: vec![Transition {
            state: JobStatus::Pending,
            at: now,
            reason: "submitted".into(),
        }],
        injected_failures: 0,
        retry_of: new.retry_of.cloned(),
        cancellation: None,
        pause: None,
        paused_seconds: 0,
        undo_stages: new.kind.undo_stages(new.params).into_iter().map(str::to_owned).collect(),
        compensation: None,
        resumes: 0,
        continuations: 0,
        dispatches: 0,
        enqueues: 0,
        priority: new.priority,
        policy: Some(stored_policy(new.kind, &deps.policy_overrides)),
        resumed_from: new.resume.as_ref().map(|(from, progress)| ResumedFrom {
            job_id: from.clone(),
            stage: progress.stage.clone(),
            items_done: progress.items_done,
        }),
        waiting: None,
        stalled_at: None,
        not_before: new.not_before,
        retry_at: None,
        last_error: None,
        summary: None,
        scheduled: new.scheduled.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kinds_policy_is_stored_as_it_publishes_it_with_overrides_applied() {
        let registry = longhaul_jobs::registry();
        let none = PolicyOverrides::default();
        for kind in registry.kinds() {
            let stored = serde_json::to_value(stored_policy(kind, &none)).unwrap();
            let published = serde_json::to_value(kind.policy()).unwrap();
            for field in ["max_attempts", "max_runtime_seconds", "result_retention_seconds"] {
                assert_eq!(stored[field], published[field], "{} {field}", kind.name());
            }
            assert_eq!(stored["checkpoint"], published["checkpoint"], "{}", kind.name());
            assert_eq!(stored["worker"], published["worker"], "{}", kind.name());
        }
        let name = registry.names()[0];
        let overrides =
            PolicyOverrides::parse(&format!(r#"{{"{name}": {{"max_attempts": 9}}}}"#), &[name])
                .unwrap();
        let kind = registry.get(name).unwrap();
        assert_eq!(stored_policy(kind, &overrides).max_attempts, 9);
        // The stored default is the worker API's default.
        let default = serde_json::to_value(longhaul_worker::Policy::default()).unwrap();
        let default: JobPolicy = serde_json::from_value(default).unwrap();
        assert_eq!(default, JobPolicy::default());
    }

    #[test]
    fn a_kinds_undo_stages_for_the_params_are_what_the_job_stores() {
        let registry = longhaul_jobs::registry();
        let demo = registry.get("demo").unwrap();
        let with = serde_json::json!({"items": 1, "compensate": true});
        assert_eq!(demo.undo_stages(&with), ["process"]);
        assert!(demo.undo_stages(&serde_json::json!({"items": 1})).is_empty());
        assert!(
            demo.undo_stages(&serde_json::json!({"items": "x"})).is_empty(),
            "bad params: none"
        );
    }
}
