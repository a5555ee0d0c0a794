//! The fault injector: the plan in force, its dice, and what it injected.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use super::{FaultCounts, FaultPlan, Invocation, JournalEntry};

/// The stack's fault injector, shared by the edge, the hosts and the event sources.
#[derive(Debug, Default)]
pub struct Faults {
    pub(super) plan: RwLock<FaultPlan>,
    rng: Mutex<Option<fastrand::Rng>>,
    crashes_by_job: Mutex<HashMap<String, u32>>,
    crashed_before: AtomicU64,
    crashed_after: AtomicU64,
    throttled: AtomicU64,
    denied: AtomicU64,
    duplicated: AtomicU64,
    duplicated_starts: AtomicU64,
    paused: AtomicU64,
    pub(super) pauses_over: AtomicU64,
    paused_jobs: Mutex<HashSet<String>>,
    crash_sites: Mutex<BTreeMap<String, u64>>,
    pause_sites: Mutex<BTreeMap<String, u64>>,
    pub(super) journal: Mutex<Vec<JournalEntry>>,
    /// Leases invocations minted by claiming their job (invocation → job key, lease).
    pub(super) claimed: Mutex<HashMap<u64, (String, String)>>,
}

/// Where a crash strikes relative to the AWS call that triggers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// The call never leaves the function.
    BeforeCall,
    /// The call takes effect; the function dies before it sees the answer.
    AfterCall,
}

impl Faults {
    /// Installs `plan`, resetting the dice, the counts and the journal.
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.rng.lock().expect("fault rng") = Some(fastrand::Rng::with_seed(plan.seed));
        *self.plan.write().expect("fault plan") = plan;
        self.crashes_by_job.lock().expect("crash counts").clear();
        self.paused_jobs.lock().expect("paused jobs").clear();
        self.crash_sites.lock().expect("crash sites").clear();
        self.pause_sites.lock().expect("pause sites").clear();
        self.journal.lock().expect("journal").clear();
        self.claimed.lock().expect("claimed leases").clear();
        for counter in [
            &self.crashed_before,
            &self.crashed_after,
            &self.throttled,
            &self.denied,
            &self.duplicated,
            &self.duplicated_starts,
            &self.paused,
            &self.pauses_over,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }

    /// The plan in force.
    pub fn plan(&self) -> FaultPlan {
        self.plan.read().expect("fault plan").clone()
    }

    /// How many faults were injected since the plan was installed.
    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            crashed_before_call: self.crashed_before.load(Ordering::Relaxed),
            crashed_after_call: self.crashed_after.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            duplicated_batches: self.duplicated.load(Ordering::Relaxed),
            duplicated_starts: self.duplicated_starts.load(Ordering::Relaxed),
            paused: self.paused.load(Ordering::Relaxed),
            pauses_over: self.pauses_over.load(Ordering::Relaxed),
            crash_sites: self.crash_sites.lock().expect("crash sites").clone(),
            pause_sites: self.pause_sites.lock().expect("pause sites").clone(),
        }
    }

    fn roll(&self, probability: f64) -> bool {
        if probability <= 0.0 {
            return false;
        }
        let mut rng = self.rng.lock().expect("fault rng");
        rng.get_or_insert_with(|| fastrand::Rng::with_seed(0)).f64() < probability
    }

    /// Whether the plan may pause a call of `operation` to `uri` with `body` at all (see
    /// [`FaultPlan::pause_only`]).
    pub fn pause_targets(&self, operation: &str, uri: &str, body: Option<&[u8]>) -> bool {
        let plan = self.plan.read().expect("fault plan");
        plan.pause_only.as_ref().is_none_or(|only| only.matches(operation, uri, body))
    }

    /// Whether the plan may crash a call of `operation` to `uri` with `body` at all (see
    /// [`FaultPlan::crash_only`]).
    pub fn crash_targets(&self, operation: &str, uri: &str, body: Option<&[u8]>) -> bool {
        let plan = self.plan.read().expect("fault plan");
        plan.crash_only.as_ref().is_none_or(|only| only.matches(operation, uri, body))
    }

    /// Whether `invocation` crashes at the AWS call (`operation`, as `service:Operation`) it
    /// is about to make, and where.
    pub fn crash_at_call(&self, invocation: &Invocation, operation: &str) -> Option<Crash> {
        let plan = self.plan.read().expect("fault plan");
        if !plan.crash_functions.contains(&invocation.function) {
            return None;
        }
        let crash = if self.roll(plan.crash_before_call) {
            Crash::BeforeCall
        } else if self.roll(plan.crash_after_call) {
            Crash::AfterCall
        } else {
            return None;
        };
        if plan.max_crashes_per_job > 0 {
            let job = invocation.crash_key.clone().unwrap_or_default();
            let mut counts = self.crashes_by_job.lock().expect("crash counts");
            let count = counts.entry(job).or_default();
            if *count >= plan.max_crashes_per_job {
                return None;
            }
            *count += 1;
        }
        let (counter, side) = match crash {
            Crash::BeforeCall => (&self.crashed_before, "before"),
            Crash::AfterCall => (&self.crashed_after, "after"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let site = format!("{} {operation} {side}", invocation.function);
        *self.crash_sites.lock().expect("crash sites").entry(site).or_default() += 1;
        Some(crash)
    }

    /// How long `invocation` pauses before the AWS call (`operation`) it is about to make, if
    /// it does: only an invocation of a planned function that holds (`holds_lease`) a job's
    /// lease, at most once per job.
    pub fn pause_at_call(
        &self,
        invocation: &Invocation,
        operation: &str,
        holds_lease: bool,
    ) -> Option<std::time::Duration> {
        let plan = self.plan.read().expect("fault plan");
        let job = invocation.job_id.as_ref()?;
        if !holds_lease
            || !plan.pause_functions.contains(&invocation.function)
            || !self.roll(plan.pause_before_call)
        {
            return None;
        }
        let mut paused_jobs = self.paused_jobs.lock().expect("paused jobs");
        if (plan.max_pauses > 0 && paused_jobs.len() as u64 >= plan.max_pauses)
            || !paused_jobs.insert(job.clone())
        {
            return None;
        }
        drop(paused_jobs);
        self.paused.fetch_add(1, Ordering::Relaxed);
        let site = format!("{} {operation}", invocation.function);
        *self.pause_sites.lock().expect("pause sites").entry(site).or_default() += 1;
        Some(std::time::Duration::from_millis(plan.pause_ms))
    }

    /// Whether the edge sends the `StartExecution` it is about to forward twice, or runs the
    /// asynchronous invocation it is about to queue twice.
    pub fn duplicate_start(&self) -> bool {
        let probability = self.plan.read().expect("fault plan").duplicate_start;
        let hit = self.roll(probability);
        if hit {
            self.duplicated_starts.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Whether the edge throttles the call it is about to forward (`operation`, with its
    /// request URI and body).
    pub fn throttle_call(&self, operation: &str, uri: &str, body: &[u8]) -> bool {
        let probability = {
            let plan = self.plan.read().expect("fault plan");
            match &plan.throttle_only {
                Some(only) if !only.matches(operation, uri, Some(body)) => 0.0,
                _ => plan.throttle,
            }
        };
        let hit = self.roll(probability);
        if hit {
            self.throttled.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Whether the edge refuses the call of `operation` to `uri` with `body` it is about to
    /// forward (see [`FaultPlan::deny`]).
    pub fn deny_call(&self, operation: &str, uri: &str, body: &[u8]) -> bool {
        let plan = self.plan.read().expect("fault plan");
        let hit = plan.deny.as_ref().is_some_and(|only| only.matches(operation, uri, Some(body)));
        if hit {
            self.denied.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Whether an SQS or stream batch is delivered twice.
    pub fn duplicate_delivery(&self) -> bool {
        let probability = self.plan.read().expect("fault plan").duplicate_delivery;
        let hit = self.roll(probability);
        if hit {
            self.duplicated.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::faults::CallMatch;
    use crate::checks::faults::invocation::tests::invocation;

    #[test]
    fn crashes_only_target_the_planned_functions_and_respect_the_per_job_cap() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan {
            crash_functions: vec!["StageFunction".into()],
            crash_before_call: 1.0,
            max_crashes_per_job: 2,
            ..FaultPlan::default()
        });
        let other = Invocation::new("DispatcherFunction", None);
        assert_eq!(faults.crash_at_call(&other, "s3:GetObject"), None);
        let stage = invocation("j1");
        assert_eq!(faults.crash_at_call(&stage, "s3:GetObject"), Some(Crash::BeforeCall));
        assert_eq!(faults.crash_at_call(&stage, "dynamodb:UpdateItem"), Some(Crash::BeforeCall));
        assert_eq!(
            faults.crash_at_call(&stage, "s3:GetObject"),
            None,
            "the third crash of j1 exceeds the cap"
        );
        assert_eq!(
            faults.crash_at_call(&invocation("j2"), "s3:GetObject"),
            Some(Crash::BeforeCall)
        );
        let counts = faults.counts();
        assert_eq!(counts.crashed_before_call, 3);
        assert_eq!(
            counts.crash_sites,
            BTreeMap::from([
                ("StageFunction dynamodb:UpdateItem before".to_owned(), 1),
                ("StageFunction s3:GetObject before".to_owned(), 2)
            ])
        );
    }

    #[test]
    fn a_plan_can_aim_its_crashes_at_one_kind_of_call() {
        let faults = Faults::default();
        let only = CallMatch {
            operation: "dynamodb:PutItem".into(),
            contains: "checkpoints/j1/render/".into(),
        };
        faults.set_plan(FaultPlan { crash_only: Some(only), ..FaultPlan::default() });
        let body = br#"{"Item":{"checkpoint_key":{"S":"checkpoints/j1/render/00000000000000000003.json"}}}"#;
        assert!(faults.crash_targets("dynamodb:PutItem", "/", Some(body)));
        assert!(!faults.crash_targets("dynamodb:UpdateItem", "/", Some(body)), "another operation");
        assert!(!faults.crash_targets("dynamodb:PutItem", "/", Some(b"{}")), "another request");
        assert!(
            faults.crash_targets("dynamodb:PutItem", "/bucket/checkpoints/j1/render/x", None),
            "the URI counts too"
        );
        faults.set_plan(FaultPlan::default());
        assert!(faults.crash_targets("s3:GetObject", "/", None), "no aim: every call");
    }

    #[test]
    fn a_plan_can_refuse_one_kind_of_call() {
        let faults = Faults::default();
        let only =
            CallMatch { operation: "s3:GetObject".into(), contains: "uploads/u/x.csv".into() };
        faults.set_plan(FaultPlan { deny: Some(only), ..FaultPlan::default() });
        assert!(faults.deny_call("s3:GetObject", "/bucket/uploads/u/x.csv", b""));
        assert!(!faults.deny_call("s3:HeadObject", "/bucket/uploads/u/x.csv", b""));
        assert!(!faults.deny_call("s3:GetObject", "/bucket/uploads/u/y.csv", b""));
        assert_eq!(faults.counts().denied, 1);
        faults.set_plan(FaultPlan::default());
        assert!(!faults.deny_call("s3:GetObject", "/bucket/uploads/u/x.csv", b""), "no plan");
        assert_eq!(faults.counts().denied, 0);
    }

    #[test]
    fn a_submission_is_capped_by_its_idempotency_key() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan {
            crash_functions: vec!["SubmitFunction".into()],
            crash_after_call: 1.0,
            max_crashes_per_job: 1,
            ..FaultPlan::default()
        });
        let submit = |key: &str| {
            Invocation::new(
                "SubmitFunction",
                Some(&serde_json::json!({"headers": {"idempotency-key": key}})),
            )
        };
        assert_eq!(faults.crash_at_call(&submit("k1"), "dynamodb:PutItem"), Some(Crash::AfterCall));
        assert_eq!(
            faults.crash_at_call(&submit("k1"), "dynamodb:PutItem"),
            None,
            "k1's retry is spared"
        );
        assert_eq!(
            faults.crash_at_call(&submit("k2"), "dynamodb:PutItem"),
            Some(Crash::AfterCall),
            "another submission is not"
        );
    }

    #[test]
    fn only_a_lease_holder_of_a_planned_function_pauses_and_once_per_job() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan {
            pause_functions: vec!["StageFunction".into()],
            pause_before_call: 1.0,
            pause_ms: 1_500,
            ..FaultPlan::default()
        });
        assert_eq!(
            faults.pause_at_call(&invocation("j1"), "s3:PutObject", false),
            None,
            "not before it holds the lease"
        );
        assert_eq!(
            faults.pause_at_call(
                &Invocation::new("DispatcherFunction", None),
                "s3:PutObject",
                true
            ),
            None
        );
        assert_eq!(
            faults.pause_at_call(&invocation("j1"), "s3:PutObject", true),
            Some(std::time::Duration::from_millis(1_500))
        );
        assert_eq!(
            faults.pause_at_call(&invocation("j1"), "s3:PutObject", true),
            None,
            "once per job"
        );
        faults.set_plan(FaultPlan { max_pauses: 1, ..faults.plan() });
        assert!(faults.pause_at_call(&invocation("j2"), "s3:PutObject", true).is_some());
        assert_eq!(
            faults.pause_at_call(&invocation("j3"), "s3:PutObject", true),
            None,
            "at most max_pauses in all"
        );
        assert_eq!(faults.counts().paused, 1);
        assert_eq!(
            faults.counts().pause_sites,
            BTreeMap::from([("StageFunction s3:PutObject".to_owned(), 1)])
        );
    }

    #[test]
    fn throttling_aimed_at_one_call_spares_the_others() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan {
            throttle: 1.0,
            throttle_only: Some(CallMatch {
                operation: "sfn:StartExecution".into(),
                contains: "job-1".into(),
            }),
            ..FaultPlan::default()
        });
        assert!(faults.throttle_call("sfn:StartExecution", "/", br#"{"name":"job-1-1"}"#));
        assert!(!faults.throttle_call("sfn:StartExecution", "/", br#"{"name":"job-2-1"}"#));
        assert!(!faults.throttle_call("dynamodb:PutItem", "/", br#"{"pk":"JOB#job-1"}"#));
        assert_eq!(faults.counts().throttled, 1);
    }

    #[test]
    fn no_plan_injects_nothing() {
        let faults = Faults::default();
        assert_eq!(faults.crash_at_call(&invocation("j1"), "s3:GetObject"), None);
        assert_eq!(faults.pause_at_call(&invocation("j1"), "s3:PutObject", true), None);
        assert!(
            !faults.throttle_call("sqs:SendMessage", "/", b"")
                && !faults.duplicate_delivery()
                && !faults.duplicate_start()
        );
        assert_eq!(faults.counts(), FaultCounts::default());
    }
}
