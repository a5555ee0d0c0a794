//! **The repair sweep** (`ScheduleRepairFunction`, hourly): every schedule's EventBridge
//! Scheduler twin is made what its record says.
//!
//! The record is the truth, and the API writes the twin after it: a twin write that failed
//! after a change (answered `503`), a twin deleted or edited by hand in the console, or one
//! lost with its group would otherwise leave a schedule that fires wrongly or never. Each run
//! walks every schedule (the status index's `schedule#<shard>` buckets, whoever owns them),
//! reads its record and its twin, and rewrites the twin whole where it is missing or differs
//! ([`Twin::of`]); then walks the twins in the group and deletes any whose schedule is gone (a
//! `DELETE` whose twin could not be deleted, or a twin rewritten by this sweep while its
//! schedule was being deleted). All within its budget; a walk the budget cuts starts over next
//! run (a run reads a few requests per schedule, so at the default budget a deployment's 100
//! schedules per tenant of many tenants fit in one). What it cannot repair is logged with the
//! schedule id and counted; the next run tries again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobStore, STATUS_SHARDS, ScheduleEntry};
use longhaul_aws::ports::{ScheduleStore, ScheduleSweep, ScheduleTwins};
use longhaul_aws::scheduler::{ScheduleFiring, Scheduler, SchedulerTarget, Twin};
use longhaul_domain::schedules::ScheduleId;
use serde::Serialize;

/// Schedules read per page of the walk.
const PAGE: u32 = 100;

/// The sweep's configuration.
#[derive(Debug, Clone)]
pub struct RepairConfig {
    /// `TABLE_NAME`.
    pub table: String,
    /// Where twins live and what they send to.
    pub target: SchedulerTarget,
    /// `LONGHAUL_REPAIR_BUDGET_SECONDS` (240): how long a run walks.
    pub budget: Duration,
}

impl RepairConfig {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(RepairConfig {
            table: vars.required("TABLE_NAME")?,
            target: SchedulerTarget::from_vars(vars)?,
            budget: Duration::from_secs(vars.parsed_or("LONGHAUL_REPAIR_BUDGET_SECONDS", 240)?),
        })
    }
}

/// What the sweep needs: the records, a walk over all of them, and the twins.
#[derive(Debug, Clone)]
pub struct RepairDeps {
    /// The records.
    pub store: Arc<dyn ScheduleStore>,
    /// Every schedule, shard by shard.
    pub sweep: Arc<dyn ScheduleSweep>,
    /// The twins.
    pub twins: Arc<dyn ScheduleTwins>,
    /// How long a run walks.
    pub budget: Duration,
}

impl RepairDeps {
    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &RepairConfig) -> Self {
        let store = JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone());
        RepairDeps {
            store: Arc::new(store.clone()),
            sweep: Arc::new(store),
            twins: Arc::new(Scheduler::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_scheduler::Client::new),
                config.target.clone(),
            )),
            budget: config.budget,
        }
    }
}

/// What a run did (the function's result, and its log line).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RepairReport {
    /// Schedules whose twin was compared with their record.
    pub checked: u64,
    /// Twins rewritten because they were missing or differed.
    pub repaired: u64,
    /// Twins whose schedule is gone (deleted while its twin could not be), deleted.
    pub orphans: u64,
    /// Schedules that could not be checked or repaired (logged; the next run tries again).
    pub errors: u64,
    /// Whether the budget cut the walk (the rest waits for the next run).
    pub unfinished: bool,
}

/// One run: walks every schedule until done or `budget` is spent.
pub async fn repair(deps: &RepairDeps) -> RepairReport {
    let deadline = Instant::now() + deps.budget;
    let mut report = RepairReport::default();
    // The schedules whose record was just read: their twins are no orphans, and are not read
    // a second time by the orphan walk.
    let mut recorded = HashSet::new();
    for shard in 0..STATUS_SHARDS {
        let mut after: Option<ScheduleId> = None;
        loop {
            if Instant::now() >= deadline {
                report.unfinished = true;
                tracing::warn!(report = ?report, "the budget cut the repair walk; the next run starts over");
                return report;
            }
            let page = match deps.sweep.schedule_entries(shard, after.as_ref(), PAGE).await {
                Ok(page) => page,
                Err(err) => {
                    tracing::error!(shard, error = %err, "listing schedules failed; the shard waits for the next run");
                    report.errors += 1;
                    break;
                }
            };
            for entry in &page.entries {
                if check(deps, entry, &mut report).await {
                    recorded.insert(entry.schedule_id.to_string());
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    // Then the twins: one whose schedule is gone fires into nothing, and is billed for it.
    let mut token = None;
    loop {
        if Instant::now() >= deadline {
            report.unfinished = true;
            tracing::warn!(report = ?report, "the budget cut the orphan walk; the next run starts over");
            return report;
        }
        let (names, next) = match deps.twins.twin_names(token).await {
            Ok(page) => page,
            Err(err) => {
                tracing::error!(error = %err, "listing twins failed; orphans wait for the next run");
                report.errors += 1;
                break;
            }
        };
        for name in names.iter().filter(|name| !recorded.contains(*name)) {
            orphan(deps, name, &mut report).await;
        }
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    tracing::info!(report = ?report, "schedule repair run");
    report
}

/// Deletes the twin `name` if its schedule is gone.
async fn orphan(deps: &RepairDeps, name: &str, report: &mut RepairReport) {
    let failed = |report: &mut RepairReport, doing: &str, err: &dyn std::fmt::Display| {
        tracing::error!(schedule_id = name, error = %err, "{doing} failed");
        report.errors += 1;
    };
    let twin = match deps.twins.twin(name).await {
        Ok(Some(twin)) => twin,
        Ok(None) => return,
        Err(err) => return failed(report, "reading a twin", &err),
    };
    // Its owner is in what it sends; a twin that is not one of ours (its input is not a
    // firing) is left alone.
    let Ok(firing) = serde_json::from_str::<ScheduleFiring>(&twin.input) else {
        tracing::warn!(
            schedule_id = name,
            "a twin in the group that is not a schedule's; left alone"
        );
        return;
    };
    let (Ok(owner), Ok(id)) = (firing.owner.parse(), firing.schedule_id.parse::<ScheduleId>())
    else {
        tracing::warn!(schedule_id = name, "a twin whose firing names no schedule; left alone");
        return;
    };
    match deps.store.schedule(&owner, &id).await {
        Ok(Some(_)) => {}
        Ok(None) => match deps.twins.delete_twin(name).await {
            Ok(_) => {
                report.orphans += 1;
                tracing::warn!(schedule_id = name, "a twin whose schedule is gone; deleted");
            }
            Err(err) => failed(report, "deleting an orphan twin", &err),
        },
        Err(err) => failed(report, "reading an orphan twin's schedule", &err),
    }
}

/// Makes `entry`'s twin what its record says; whether the record was there.
async fn check(deps: &RepairDeps, entry: &ScheduleEntry, report: &mut RepairReport) -> bool {
    let id = entry.schedule_id.as_str();
    let record = match deps.store.schedule(&entry.owner, &entry.schedule_id).await {
        Ok(Some(record)) => record,
        // Deleted since it was listed: the orphan walk deletes a twin left behind.
        Ok(None) => return false,
        Err(err) => {
            tracing::error!(schedule_id = id, error = %err, "reading a schedule to repair failed");
            report.errors += 1;
            return false;
        }
    };
    report.checked += 1;
    let expected = Twin::of(&record);
    match deps.twins.twin(id).await {
        Ok(Some(twin)) if twin.fires_as(&expected) => {}
        Ok(found) => match deps.twins.put_twin(&expected).await {
            Ok(()) => {
                report.repaired += 1;
                tracing::warn!(
                    schedule_id = id,
                    missing = found.is_none(),
                    "a schedule's twin was missing or differed from its record; rewritten"
                );
            }
            Err(err) => {
                tracing::error!(schedule_id = id, error = %err, "rewriting a schedule's twin failed");
                report.errors += 1;
            }
        },
        Err(err) => {
            tracing::error!(schedule_id = id, error = %err, "reading a schedule's twin failed");
            report.errors += 1;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_aws::jobs::ScheduleRecord;
    use longhaul_domain::Timestamp;
    use longhaul_domain::schedules::ScheduleState;
    use longhaul_memory::{MemoryScheduleTwins, MemorySchedules};

    fn record(owner: &str, state: ScheduleState) -> ScheduleRecord {
        ScheduleRecord {
            state,
            ..ScheduleRecord::new(
                owner.parse().unwrap(),
                "demo".into(),
                serde_json::json!({}),
                "rate(5 minutes)".parse().unwrap(),
                "UTC".parse().unwrap(),
                Timestamp::now(),
            )
        }
    }

    #[tokio::test]
    async fn missing_and_differing_twins_are_rewritten_and_matching_ones_left_alone() {
        let store = Arc::new(MemorySchedules::new());
        let twins = Arc::new(MemoryScheduleTwins::new());
        let (fine, missing, paused_but_firing) = (
            record("alice", ScheduleState::Enabled),
            record("bob", ScheduleState::Enabled),
            record("alice", ScheduleState::Paused),
        );
        for r in [&fine, &missing, &paused_but_firing] {
            assert!(store.create_schedule(r, 10).await.unwrap());
        }
        twins.put_twin(&Twin::of(&fine)).await.unwrap();
        // Edited by hand: enabled although its record is paused.
        let wrong = Twin { enabled: true, ..Twin::of(&paused_but_firing) };
        twins.put_twin(&wrong).await.unwrap();
        let deps = RepairDeps {
            store: store.clone(),
            sweep: store.clone(),
            twins: twins.clone(),
            budget: Duration::from_secs(60),
        };
        let report = repair(&deps).await;
        assert_eq!(
            report,
            RepairReport { checked: 3, repaired: 2, orphans: 0, errors: 0, unfinished: false },
            "{report:?}"
        );
        let all = twins.all();
        for r in [&fine, &missing, &paused_but_firing] {
            assert_eq!(all.get(r.schedule_id.as_str()), Some(&Twin::of(r)), "as its record says");
        }
        // Nothing to do the second time.
        assert_eq!(repair(&deps).await.repaired, 0);
    }

    #[tokio::test]
    async fn a_twin_whose_schedule_is_gone_is_deleted_and_no_other() {
        let store = Arc::new(MemorySchedules::new());
        let twins = Arc::new(MemoryScheduleTwins::new());
        let kept: Vec<ScheduleRecord> =
            (0..3).map(|_| record("alice", ScheduleState::Enabled)).collect();
        for r in &kept {
            store.create_schedule(r, 10).await.unwrap();
            twins.put_twin(&Twin::of(r)).await.unwrap();
        }
        let gone = record("bob", ScheduleState::Enabled);
        twins.put_twin(&Twin::of(&gone)).await.unwrap();
        let foreign = Twin { input: "{}".into(), name: "someone-elses".into(), ..Twin::of(&gone) };
        twins.put_twin(&foreign).await.unwrap();
        let deps = RepairDeps {
            store: store.clone(),
            sweep: store.clone(),
            twins: twins.clone(),
            budget: Duration::from_secs(60),
        };
        let report = repair(&deps).await;
        assert_eq!((report.orphans, report.errors), (1, 0), "{report:?}");
        let left = twins.all();
        assert!(!left.contains_key(gone.schedule_id.as_str()), "the orphan is deleted");
        assert!(left.contains_key("someone-elses"), "a twin that is not a schedule's is left");
        for r in &kept {
            assert!(left.contains_key(r.schedule_id.as_str()), "a schedule's twin stays");
        }
    }

    #[tokio::test]
    async fn a_twin_that_cannot_be_read_is_counted_and_the_walk_goes_on() {
        let store = Arc::new(MemorySchedules::new());
        let twins = Arc::new(MemoryScheduleTwins::new());
        store.create_schedule(&record("alice", ScheduleState::Enabled), 10).await.unwrap();
        twins.set_unavailable(true);
        let deps = RepairDeps {
            store: store.clone(),
            sweep: store.clone(),
            twins: twins.clone(),
            budget: Duration::from_secs(60),
        };
        let report = repair(&deps).await;
        assert_eq!((report.checked, report.repaired), (1, 0));
        assert!(report.errors >= 1, "{report:?}");
        twins.set_unavailable(false);
        assert_eq!(repair(&deps).await.repaired, 1, "the next run repairs it");
    }
}
