//! The contracts of the other services' ports: executions ([`JobExecutions`]) — a name runs
//! once, a missing execution reads as absent and stops as a no-op — and the submission rate
//! limit ([`RateLimits`]) — a window admits its limit per owner, then refuses until the next.

use longhaul_aws::executions::StartOutcome;
use longhaul_aws::limits::Admission;
use longhaul_aws::ports::{JobExecutions, RateLimits, UploadQuotas};
use longhaul_domain::JobId;
use longhaul_domain::limits::RateWindow;

/// Runs the executions' contract on `executions`, whose executions do not end by themselves
/// while the contract runs (a state machine that waits). Panics, naming the clause.
pub async fn executions(executions: &impl JobExecutions) {
    let name = format!("contract-{}", JobId::new());
    let input = serde_json::json!({"job_id": name});
    assert_eq!(executions.status(&name).await.unwrap(), None, "a missing execution is absent");
    executions.stop(&name, "nothing to stop").await.expect("stopping a missing one is a no-op");
    let first = executions.start(&name, &input).await.unwrap();
    assert!(matches!(first, StartOutcome::Started { .. }), "a new name starts: {first:?}");
    assert_eq!(executions.status(&name).await.unwrap().as_deref(), Some("RUNNING"));
    // A repeat is never a second run: the same execution, or refused as existing.
    match executions.start(&name, &input).await.unwrap() {
        StartOutcome::AlreadyExists => {}
        again @ StartOutcome::Started { .. } => assert_eq!(again, first, "the same execution"),
    }
    let other = serde_json::json!({"job_id": name, "other": true});
    assert_eq!(
        executions.start(&name, &other).await.unwrap(),
        StartOutcome::AlreadyExists,
        "a name used with other input is taken"
    );
    executions.stop(&name, "contract").await.unwrap();
    let stopped = executions.status(&name).await.unwrap();
    assert!(
        matches!(stopped.as_deref(), Some("ABORTED")),
        "a stopped execution is aborted: {stopped:?}"
    );
    assert_eq!(
        executions.start(&name, &input).await.unwrap(),
        StartOutcome::AlreadyExists,
        "an ended execution's name is never reused"
    );
}

/// Runs the upload quota's contract on `quota`, which allows 100 bytes per owner and day: a
/// day's uploads fit up to the quota, one that does not fit is refused (nothing counted) until
/// the next day, and each owner has a quota of its own. Run again if the day turned meanwhile.
pub async fn upload_quotas(quota: &impl UploadQuotas) {
    for _ in 0..3 {
        let owner = crate::owner(&format!("contract-quota-{}", JobId::new()));
        let other = crate::owner(&format!("contract-quota-{}", JobId::new()));
        let day = RateWindow::day_of(chrono::Utc::now().timestamp()).index;
        let charges = [
            quota.charge(&owner, 60).await.unwrap(),
            quota.charge(&owner, 41).await.unwrap(),
            quota.charge(&owner, 40).await.unwrap(),
            quota.charge(&owner, 1).await.unwrap(),
            quota.charge(&other, 101).await.unwrap(),
            quota.charge(&other, 100).await.unwrap(),
        ];
        if RateWindow::day_of(chrono::Utc::now().timestamp()).index != day {
            continue;
        }
        assert_eq!(charges[0], Admission::Admitted);
        let Admission::Limited { retry_after } = charges[1] else {
            panic!("60 + 41 bytes are over a quota of 100: {:?}", charges[1]);
        };
        assert!((1..=86_400).contains(&retry_after), "until the next day: {retry_after}");
        assert_eq!(charges[2], Admission::Admitted, "the refused 41 were not counted");
        assert!(matches!(charges[3], Admission::Limited { .. }), "the day's quota is used up");
        assert!(matches!(charges[4], Admission::Limited { .. }), "more than a day's quota");
        assert_eq!(charges[5], Admission::Admitted, "another owner has a quota of its own");
        return;
    }
    panic!("three days in a row turned during the contract");
}

/// Runs the rate limit's contract on `limits`, which admits two submissions per owner and
/// minute. A clause that straddles a window's end (the minute turned between its charges) is
/// run again in the next window, so the contract does not depend on when it runs.
pub async fn rate_limits(limits: &impl RateLimits) {
    for _ in 0..3 {
        let owner = crate::owner(&format!("contract-rate-{}", JobId::new()));
        let other = crate::owner(&format!("contract-rate-{}", JobId::new()));
        let window = RateWindow::at(chrono::Utc::now().timestamp()).index;
        let charges = [
            limits.charge(&owner).await.unwrap(),
            limits.charge(&owner).await.unwrap(),
            limits.charge(&owner).await.unwrap(),
            limits.charge(&other).await.unwrap(),
        ];
        if RateWindow::at(chrono::Utc::now().timestamp()).index != window {
            continue;
        }
        assert_eq!(charges[..2], [Admission::Admitted, Admission::Admitted], "the limit admits");
        match charges[2] {
            Admission::Limited { retry_after } => {
                assert!((1..=60).contains(&retry_after), "until the next window: {retry_after}")
            }
            Admission::Admitted => panic!("a third submission in the window is refused"),
        }
        assert_eq!(charges[3], Admission::Admitted, "another owner has a window of its own");
        return;
    }
    panic!("three windows in a row turned during the contract");
}
