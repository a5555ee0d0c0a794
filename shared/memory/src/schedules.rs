//! Schedules in memory: the records ([`ScheduleStore`]), their twins ([`ScheduleTwins`]) and
//! the firing queue ([`ScheduleFirings`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use longhaul_aws::AwsError;
use longhaul_aws::jobs::{
    FireRecord, FireWrite, ScheduleEntries, ScheduleEntry, SchedulePage, ScheduleRecord,
    ScheduleWrite, StoreError, schedule_bucket,
};
use longhaul_aws::ports::{ScheduleFirings, ScheduleStore, ScheduleSweep, ScheduleTwins, Warm};
use longhaul_aws::scheduler::{ScheduleFiring, Twin};
use longhaul_domain::Owner;
use longhaul_domain::schedules::{FireOutcome, ScheduleId};

use crate::Outage;

/// Schedule records by (owner, id), as the table's owner partitions hold them.
#[derive(Debug, Default)]
pub struct MemorySchedules {
    records: Mutex<BTreeMap<(Owner, ScheduleId), ScheduleRecord>>,
    outage: Outage,
}

impl MemorySchedules {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every call fail (or work again).
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<(Owner, ScheduleId), ScheduleRecord>> {
        self.records.lock().expect("schedules lock")
    }

    fn check(&self, doing: &str) -> Result<(), StoreError> {
        self.outage.check(doing).map_err(StoreError::from)
    }
}

fn count(record: &mut ScheduleRecord, fire: &FireRecord) {
    match fire.outcome {
        FireOutcome::Submitted => record.submitted += 1,
        FireOutcome::Skipped => record.skipped += 1,
        FireOutcome::Refused => record.refused += 1,
    }
}

fn bump(record: &mut ScheduleRecord, fire: &FireRecord) {
    count(record, fire);
    record.last_fire = Some(fire.last_fire());
    if let Some(job_id) = &fire.job_id {
        record.live_job = Some(job_id.clone());
    }
}

impl Warm for MemorySchedules {}

#[async_trait]
impl ScheduleStore for MemorySchedules {
    async fn create_schedule(&self, record: &ScheduleRecord, max: u32) -> Result<bool, StoreError> {
        self.check("create schedule")?;
        let mut records = self.lock();
        let owned = records.keys().filter(|(owner, _)| *owner == record.owner).count();
        if owned >= max as usize {
            return Ok(false);
        }
        let key = (record.owner.clone(), record.schedule_id.clone());
        if records.contains_key(&key) {
            return Err(StoreError::Corrupt {
                key: format!("schedule {}", record.schedule_id),
                reason: "a fresh schedule id was taken".into(),
            });
        }
        records.insert(key, record.clone());
        Ok(true)
    }

    async fn schedule(
        &self,
        owner: &Owner,
        id: &ScheduleId,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        self.check("read schedule")?;
        Ok(self.lock().get(&(owner.clone(), id.clone())).cloned())
    }

    async fn schedules(
        &self,
        owner: &Owner,
        limit: u32,
        after: Option<&ScheduleId>,
    ) -> Result<SchedulePage, StoreError> {
        self.check("list schedules")?;
        let records = self.lock();
        let mut mine = records
            .iter()
            .filter(|((o, id), _)| o == owner && after.is_none_or(|after| id > after))
            .map(|(_, record)| record.clone());
        let schedules: Vec<ScheduleRecord> = mine.by_ref().take(limit.max(1) as usize).collect();
        let next = if mine.next().is_some() {
            schedules.last().map(|last| last.schedule_id.clone())
        } else {
            None
        };
        Ok(SchedulePage { schedules, next })
    }

    async fn replace_schedule(
        &self,
        record: &ScheduleRecord,
        read: u64,
    ) -> Result<ScheduleWrite, StoreError> {
        self.check("write schedule")?;
        let mut records = self.lock();
        let Some(stored) = records.get_mut(&(record.owner.clone(), record.schedule_id.clone()))
        else {
            return Ok(ScheduleWrite::Conflict(None));
        };
        if stored.version != read {
            return Ok(ScheduleWrite::Conflict(Some(Box::new(stored.clone()))));
        }
        // The firing's attributes stay as stored, as the table's update leaves them.
        let fired = stored.clone();
        *stored = ScheduleRecord {
            schedule_id: fired.schedule_id,
            owner: fired.owner,
            created_at: fired.created_at,
            last_tick: fired.last_tick,
            last_fire: fired.last_fire,
            fired: fired.fired,
            submitted: fired.submitted,
            skipped: fired.skipped,
            refused: fired.refused,
            live_job: fired.live_job,
            held: fired.held,
            ..record.clone()
        };
        Ok(ScheduleWrite::Written)
    }

    async fn delete_schedule(&self, owner: &Owner, id: &ScheduleId) -> Result<bool, StoreError> {
        self.check("delete schedule")?;
        Ok(self.lock().remove(&(owner.clone(), id.clone())).is_some())
    }

    async fn record_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<FireWrite, StoreError> {
        self.check("record a firing")?;
        let mut records = self.lock();
        let Some(record) = records.get_mut(&(owner.clone(), id.clone())) else {
            return Ok(FireWrite::Stale);
        };
        if fire.trigger {
            if record.last_trigger == Some(fire.tick) {
                return Ok(FireWrite::Stale);
            }
            record.last_trigger = Some(fire.tick);
        } else {
            match record.last_tick {
                Some(last) if last > fire.tick => return Ok(FireWrite::Superseded),
                Some(last) if last == fire.tick => return Ok(FireWrite::Stale),
                _ => {}
            }
            record.last_tick = Some(fire.tick);
        }
        record.fired += 1;
        if fire.hold {
            record.held = Some(fire.tick);
        } else if fire.outcome == FireOutcome::Submitted {
            record.held = None;
        }
        bump(record, fire);
        Ok(FireWrite::Recorded)
    }

    async fn count_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError> {
        self.check("count a firing")?;
        let mut records = self.lock();
        let Some(record) = records.get_mut(&(owner.clone(), id.clone())) else {
            return Ok(false);
        };
        record.fired += 1;
        count(record, fire);
        Ok(true)
    }

    async fn release_held(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError> {
        self.check("release a held tick")?;
        let mut records = self.lock();
        let Some(record) = records.get_mut(&(owner.clone(), id.clone())) else {
            return Ok(false);
        };
        if record.held != Some(fire.tick) {
            return Ok(false);
        }
        record.held = None;
        record.skipped = record.skipped.saturating_sub(1);
        bump(record, fire);
        Ok(true)
    }
}

#[async_trait]
impl ScheduleSweep for MemorySchedules {
    async fn schedule_entries(
        &self,
        shard: u32,
        after: Option<&ScheduleId>,
        limit: u32,
    ) -> Result<ScheduleEntries, StoreError> {
        self.check("list schedules to repair")?;
        let bucket = format!("schedule#{shard}");
        let mut entries: Vec<ScheduleEntry> = self
            .lock()
            .values()
            .filter(|r| schedule_bucket(&r.schedule_id) == bucket)
            .filter(|r| after.is_none_or(|after| &r.schedule_id > after))
            .map(|r| ScheduleEntry { owner: r.owner.clone(), schedule_id: r.schedule_id.clone() })
            .collect();
        entries.sort_by(|a, b| a.schedule_id.cmp(&b.schedule_id));
        let more = entries.len() > limit.max(1) as usize;
        entries.truncate(limit.max(1) as usize);
        let next = if more { entries.last().map(|e| e.schedule_id.clone()) } else { None };
        Ok(ScheduleEntries { entries, next })
    }
}

/// Twins by name, as Scheduler's group holds them.
#[derive(Debug, Default)]
pub struct MemoryScheduleTwins {
    twins: Mutex<BTreeMap<String, Twin>>,
    outage: Outage,
}

impl MemoryScheduleTwins {
    /// No twins.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every call fail (or work again).
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }

    /// Every twin, by name.
    pub fn all(&self) -> BTreeMap<String, Twin> {
        self.twins.lock().expect("twins lock").clone()
    }
}

impl Warm for MemoryScheduleTwins {}

#[async_trait]
impl ScheduleTwins for MemoryScheduleTwins {
    async fn put_twin(&self, twin: &Twin) -> Result<(), AwsError> {
        self.outage.check("write schedule twin")?;
        self.twins.lock().expect("twins lock").insert(twin.name.clone(), twin.clone());
        Ok(())
    }
    async fn update_twin(&self, twin: &Twin) -> Result<bool, AwsError> {
        self.outage.check("write schedule twin")?;
        let mut twins = self.twins.lock().expect("twins lock");
        match twins.get_mut(&twin.name) {
            Some(stored) => {
                *stored = twin.clone();
                Ok(true)
            }
            None => Ok(false),
        }
    }
    async fn delete_twin(&self, name: &str) -> Result<bool, AwsError> {
        self.outage.check("delete schedule twin")?;
        Ok(self.twins.lock().expect("twins lock").remove(name).is_some())
    }
    async fn twin(&self, name: &str) -> Result<Option<Twin>, AwsError> {
        self.outage.check("read schedule twin")?;
        Ok(self.twins.lock().expect("twins lock").get(name).cloned())
    }
    async fn twin_names(
        &self,
        token: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), AwsError> {
        self.outage.check("list schedule twins")?;
        // Pages of two, so that paging is exercised; the token is the last name given.
        let twins = self.twins.lock().expect("twins lock");
        let mut names =
            twins.keys().filter(|n| token.as_ref().is_none_or(|after| *n > after)).cloned();
        let page: Vec<String> = names.by_ref().take(2).collect();
        let next = names.next().and(page.last().cloned());
        Ok((page, next))
    }
}

/// The firings sent, in order.
#[derive(Debug, Default)]
pub struct MemoryScheduleFirings {
    sent: Mutex<Vec<ScheduleFiring>>,
    outage: Outage,
}

impl MemoryScheduleFirings {
    /// Nothing sent.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every send fail (or work again).
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }

    /// Takes what was sent.
    pub fn take(&self) -> Vec<ScheduleFiring> {
        std::mem::take(&mut *self.sent.lock().expect("firings lock"))
    }
}

impl Warm for MemoryScheduleFirings {}

#[async_trait]
impl ScheduleFirings for MemoryScheduleFirings {
    async fn send_firing(&self, firing: &ScheduleFiring) -> Result<(), AwsError> {
        self.outage.check("send a firing")?;
        self.sent.lock().expect("firings lock").push(firing.clone());
        Ok(())
    }
}
