//! What the reaper decides about a job, as pure functions of times and counts.
//!
//! A job must never sit in a live state forever: a `running` job whose worker stopped
//! heartbeating is a zombie (rescued, re-dispatched within its retry budget, or failed); one
//! that heartbeats without progressing is stalled (flagged, and a zombie after a grace
//! period); one running past its job type's maximum is timed out.

use chrono::{DateTime, Utc};
use std::time::Duration;

/// The reaper's thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    /// A heartbeat older than this marks a zombie (default 90 s).
    pub heartbeat_timeout: Duration,
    /// Progress unchanged for this long, heartbeats fresh, marks the job stalled (300 s).
    pub stall: Duration,
    /// A stalled job still stalled after this long is treated as a zombie (600 s).
    pub stall_grace: Duration,
}

/// The state of a running job as the reaper reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Running {
    /// Last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// Last change of progress.
    pub progress_changed_at: DateTime<Utc>,
    /// First start.
    pub started_at: DateTime<Utc>,
    /// When it was flagged stalled, if it is.
    pub stalled_at: Option<DateTime<Utc>>,
    /// The job type's maximum run time.
    pub max_runtime: Duration,
}

/// What to do about a running job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing.
    Healthy,
    /// Running longer than its job type allows: fail it (`Job.Timeout`).
    TimedOut(String),
    /// Its worker is gone (or stalled past the grace): rescue it.
    Zombie(String),
    /// Heartbeats, no progress: flag it.
    Stalled,
    /// Flagged stalled, but progress moved again: clear the flag.
    Recovered,
}

fn age(now: DateTime<Utc>, at: DateTime<Utc>) -> Duration {
    (now - at).to_std().unwrap_or_default()
}

/// Judges a running job.
pub fn judge(now: DateTime<Utc>, job: &Running, t: &Thresholds) -> Verdict {
    if age(now, job.started_at) > job.max_runtime {
        return Verdict::TimedOut(format!(
            "ran longer than its maximum of {} s",
            job.max_runtime.as_secs()
        ));
    }
    let silent = age(now, job.heartbeat_at);
    if silent > t.heartbeat_timeout {
        return Verdict::Zombie(format!("no heartbeat for {} s", silent.as_secs()));
    }
    let still = age(now, job.progress_changed_at);
    match job.stalled_at {
        Some(_) if still <= t.stall => Verdict::Recovered,
        Some(since) if age(now, since) > t.stall_grace => Verdict::Zombie(format!(
            "stalled: no progress for {} s while heartbeating",
            still.as_secs()
        )),
        Some(_) => Verdict::Healthy,
        None if still > t.stall => Verdict::Stalled,
        None => Verdict::Healthy,
    }
}

/// How to rescue a zombie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rescue {
    /// Its result is already durable: record the success the worker did not.
    Backfill,
    /// Run it again from its checkpoint, as a new attempt.
    Redispatch,
    /// The retry budget is spent: fail it.
    Fail,
}

/// Chooses the rescue of a zombie in its `attempt`-th attempt of `max_attempts` (its policy's).
pub fn rescue(result_exists: bool, attempt: u32, max_attempts: u32) -> Rescue {
    if result_exists {
        Rescue::Backfill
    } else if attempt < max_attempts {
        Rescue::Redispatch
    } else {
        Rescue::Fail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn thresholds() -> Thresholds {
        Thresholds {
            heartbeat_timeout: Duration::from_secs(90),
            stall: Duration::from_secs(300),
            stall_grace: Duration::from_secs(600),
        }
    }

    fn job(
        now: DateTime<Utc>,
        heartbeat: i64,
        changed: i64,
        started: i64,
        stalled: Option<i64>,
    ) -> Running {
        let ago = |s: i64| now - chrono::Duration::seconds(s);
        Running {
            heartbeat_at: ago(heartbeat),
            progress_changed_at: ago(changed),
            started_at: ago(started),
            stalled_at: stalled.map(ago),
            max_runtime: Duration::from_secs(86_400),
        }
    }

    #[test]
    fn verdicts() {
        let now = Utc::now();
        let t = thresholds();
        assert_eq!(judge(now, &job(now, 1, 1, 100, None), &t), Verdict::Healthy);
        assert!(matches!(judge(now, &job(now, 91, 1, 100, None), &t), Verdict::Zombie(_)));
        assert_eq!(judge(now, &job(now, 1, 301, 400, None), &t), Verdict::Stalled);
        assert_eq!(judge(now, &job(now, 1, 400, 500, Some(100)), &t), Verdict::Healthy);
        assert!(matches!(judge(now, &job(now, 1, 1000, 1000, Some(601)), &t), Verdict::Zombie(_)));
        assert_eq!(judge(now, &job(now, 1, 5, 1000, Some(200)), &t), Verdict::Recovered);
        assert!(matches!(judge(now, &job(now, 1, 1, 86_401, None), &t), Verdict::TimedOut(_)));
        assert_eq!(rescue(true, 3, 3), Rescue::Backfill);
        assert_eq!(rescue(false, 2, 3), Rescue::Redispatch);
        assert_eq!(rescue(false, 3, 3), Rescue::Fail);
    }

    proptest! {
        /// A job whose heartbeat is fresh and which runs within its maximum is never rescued
        /// unless it has been stalled past the grace period.
        #[test]
        fn fresh_heartbeats_are_never_zombies(heartbeat in 0i64..=90, changed in 0i64..86_000, stalled in proptest::option::of(0i64..=600)) {
            let now = Utc::now();
            let verdict = judge(now, &job(now, heartbeat, changed, changed.max(heartbeat), stalled), &thresholds());
            prop_assert!(!matches!(verdict, Verdict::Zombie(_) | Verdict::TimedOut(_)), "{verdict:?}");
        }

        /// A silent worker is always acted on.
        #[test]
        fn silent_workers_are_always_zombies(heartbeat in 91i64..1_000_000, changed in 0i64..1_000_000) {
            let now = Utc::now();
            let verdict = judge(now, &job(now, heartbeat, changed, 0, None), &thresholds());
            prop_assert!(matches!(verdict, Verdict::Zombie(_)));
        }

        /// The retry budget is never exceeded.
        #[test]
        fn redispatch_stays_within_budget(attempt in 0u32..10, max in 1u32..10, exists in any::<bool>()) {
            if rescue(exists, attempt, max) == Rescue::Redispatch {
                prop_assert!(attempt < max && !exists);
            }
        }
    }
}
