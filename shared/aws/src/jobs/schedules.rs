//! Recurring schedules (`SCHEDULES#<len>:<owner>` / `SCHEDULE#<id>`): the source of truth of
//! each schedule — its spec, state and last firing. Its EventBridge Scheduler twin only fires
//! it (`crate::scheduler`).
//!
//! An owner's schedules share one partition, so a listing is one query, a count of them
//! (the tenant's cap) is one `Select=COUNT` query, and another owner's schedule id finds
//! nothing. Every change of the spec or state is a write conditional on the version read
//! ([`JobStore::replace_schedule`]); a firing writes only its own attributes, conditional on
//! its tick being newer than the last one recorded ([`JobStore::record_fire`]), so a
//! duplicated or late firing never counts twice and never overwrites a newer one.

use super::*;

use aws_sdk_dynamodb::types::{ReturnValuesOnConditionCheckFailure, Select};
use longhaul_domain::admission::Priority;
use longhaul_domain::recurrence::{ScheduleExpression, ScheduleTimeZone};
use longhaul_domain::schedules::{FireOutcome, LastFire, Overlap, ScheduleId, ScheduleState};
use serde::Deserialize;

/// Sort-key prefix of a schedule record.
const SCHEDULE_SK_PREFIX: &str = "SCHEDULE#";

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleRecord {
    /// Its id.
    pub schedule_id: ScheduleId,
    /// The principal that owns it and as whom its jobs are submitted.
    pub owner: Owner,
    /// What it submits: the job's kind,
    #[serde(rename = "type")]
    pub job_type: String,
    /// its params (checked by the kind when the schedule was written),
    pub params: serde_json::Value,
    /// its callback URL,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// and its priority.
    #[serde(default)]
    pub priority: Priority,
    /// When: EventBridge Scheduler's `cron(…)` or `rate(…)`.
    pub schedule: ScheduleExpression,
    /// The IANA time zone a cron expression is read in.
    pub timezone: ScheduleTimeZone,
    /// What a tick does while the previous job is live.
    #[serde(default)]
    pub overlap: Overlap,
    /// No tick before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Timestamp>,
    /// No tick after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<Timestamp>,
    /// Pause the schedule when one of its jobs fails.
    #[serde(default)]
    pub pause_on_failure: bool,
    /// Whether it fires.
    pub state: ScheduleState,
    /// Why it is paused, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_reason: Option<String>,
    /// The failed job that last paused it (`pause_on_failure`). Kept across a resume, so the
    /// end of that job, delivered again after its owner resumed the schedule, does not pause
    /// it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_by_job: Option<JobId>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When its spec or state last changed.
    pub updated_at: Timestamp,
    /// Bumped by every change of spec or state; the change is conditional on it.
    pub version: u64,
    /// The last tick recorded (its firing's scheduled time): a firing of this tick or an
    /// earlier one records nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_tick: Option<Timestamp>,
    /// The last trigger recorded (`POST /schedules/{id}/trigger`): kept apart from the ticks,
    /// so a trigger never makes a tick of the expression delivered after it look stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_trigger: Option<Timestamp>,
    /// What the last firing came to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fire: Option<LastFire>,
    /// Firings recorded.
    #[serde(default)]
    pub fired: u64,
    /// Of which submitted a job.
    #[serde(default)]
    pub submitted: u64,
    /// Of which were skipped.
    #[serde(default)]
    pub skipped: u64,
    /// Of which were refused.
    #[serde(default)]
    pub refused: u64,
    /// The last job it submitted: a tick while it is live obeys `overlap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_job: Option<JobId>,
    /// A tick held (`buffer_one`) until the live job ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Timestamp>,
}

impl ScheduleRecord {
    /// A new schedule of `owner`'s, made `now`: enabled, with a fresh id, no callback, normal
    /// priority, `overlap: skip`, no window, and nothing fired yet.
    pub fn new(
        owner: Owner,
        job_type: String,
        params: serde_json::Value,
        schedule: ScheduleExpression,
        timezone: ScheduleTimeZone,
        now: Timestamp,
    ) -> Self {
        ScheduleRecord {
            schedule_id: ScheduleId::new(),
            owner,
            job_type,
            params,
            callback_url: None,
            priority: Priority::Normal,
            schedule,
            timezone,
            overlap: Overlap::Skip,
            start_at: None,
            end_at: None,
            pause_on_failure: false,
            state: ScheduleState::Enabled,
            paused_reason: None,
            paused_by_job: None,
            created_at: now,
            updated_at: now,
            version: 1,
            last_tick: None,
            last_trigger: None,
            last_fire: None,
            fired: 0,
            submitted: 0,
            skipped: 0,
            refused: 0,
            live_job: None,
            held: None,
        }
    }
}

/// One firing, to record: its tick and what it came to.
#[derive(Debug, Clone, PartialEq)]
pub struct FireRecord {
    /// The tick.
    pub tick: Timestamp,
    /// The job submitted, if any.
    pub job_id: Option<JobId>,
    /// What it came to.
    pub outcome: FireOutcome,
    /// Why, for a skipped or refused tick.
    pub reason: Option<String>,
    /// Whether the tick is now held (`buffer_one`); `false` leaves a held tick as it is.
    pub hold: bool,
    /// Whether it is a trigger rather than a tick of the expression.
    pub trigger: bool,
}

impl FireRecord {
    /// The count it adds to, and its `last_fire` as stored.
    fn attributes(&self) -> (&'static str, AttributeValue) {
        let counter = match self.outcome {
            FireOutcome::Submitted => "submitted",
            FireOutcome::Skipped => "skipped",
            FireOutcome::Refused => "refused",
        };
        let last_fire =
            serde_dynamo::to_attribute_value(self.last_fire()).expect("a firing always serialises");
        (counter, last_fire)
    }

    /// The view's `last_fire` for it.
    pub fn last_fire(&self) -> LastFire {
        LastFire {
            scheduled_at: self.tick,
            job_id: self.job_id.clone(),
            outcome: self.outcome,
            reason: self.reason.clone(),
        }
    }
}

/// What a write of a schedule came to.
#[derive(Debug, Clone, PartialEq)]
pub enum ScheduleWrite {
    /// Written as given.
    Written,
    /// Not written: the schedule changed since it was read (or is gone: `None`).
    Conflict(Option<Box<ScheduleRecord>>),
}

/// What a firing's record came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireWrite {
    /// Recorded.
    Recorded,
    /// Not recorded: this tick was recorded already, or the schedule is gone.
    Stale,
    /// Not recorded: a later tick was recorded first (two ticks delivered out of order, or a
    /// tick retried after the next one). The schedule's last firing stays the later one; a job
    /// this tick made is still counted ([`JobStore::count_fire`]).
    Superseded,
}

/// A page of an owner's schedules, oldest first, and the id to continue after.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulePage {
    /// The schedules.
    pub schedules: Vec<ScheduleRecord>,
    /// Where the next page starts, if there is one.
    pub next: Option<ScheduleId>,
}

/// The status-index bucket holding schedule `id` (`schedule#<shard>`, [`STATUS_SHARDS`]
/// shards, as the job buckets are sharded).
pub fn schedule_bucket(id: &ScheduleId) -> String {
    let shard = id.chars().last().and_then(|c| c.to_digit(16)).unwrap_or(0) % STATUS_SHARDS;
    format!("{SCHEDULE_BUCKET}#{shard}")
}

/// The status-index bucket name of schedule records (never a job status).
pub const SCHEDULE_BUCKET: &str = "schedule";

/// One schedule as the status index lists it: whose, and which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleEntry {
    /// Its owner.
    pub owner: Owner,
    /// Its id.
    pub schedule_id: ScheduleId,
}

/// A page of schedule entries of one shard, and where the next starts.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleEntries {
    /// The entries, in id order.
    pub entries: Vec<ScheduleEntry>,
    /// The id to continue after, if more may follow.
    pub next: Option<ScheduleId>,
}

/// The partition of `owner`'s schedules (length-prefixed, as every owner-scoped key is).
pub fn schedules_pk(owner: &Owner) -> String {
    format!("SCHEDULES#{}:{owner}", owner.len())
}

fn schedule_key(owner: &Owner, id: &ScheduleId) -> Item {
    HashMap::from([
        ("pk".to_owned(), s(schedules_pk(owner))),
        ("sk".to_owned(), s(format!("{SCHEDULE_SK_PREFIX}{id}"))),
    ])
}

impl JobStore {
    /// Creates `record` unless its owner has `max` schedules already (`Ok(false)`). The count
    /// is checked before the write and again after it: of racing creations that together
    /// pass the cap, each sees the excess after its write and takes its own back, so the cap
    /// holds however many race (a creation refused that way is answered as over the cap).
    pub async fn create_schedule(
        &self,
        record: &ScheduleRecord,
        max: u32,
    ) -> Result<bool, StoreError> {
        if self.count_schedules(&record.owner).await? >= max {
            return Ok(false);
        }
        let mut item = to_item(record);
        item.extend(schedule_key(&record.owner, &record.schedule_id));
        // In the status index's schedule buckets, so the repair sweep finds every schedule
        // without a scan (`JobStore::schedule_entries`).
        item.insert("gsi2pk".into(), s(schedule_bucket(&record.schedule_id)));
        item.insert("gsi2sk".into(), s(record.schedule_id.as_str()));
        self.put_fresh(item, &format!("schedule {}", record.schedule_id)).await?;
        match self.count_schedules(&record.owner).await {
            Ok(count) if count > max => {
                self.delete_schedule(&record.owner, &record.schedule_id).await?;
                Ok(false)
            }
            Ok(_) => Ok(true),
            Err(err) => {
                // Answered as a failure, so the record must not stay (the repair sweep would
                // give it a twin, and a client repeating the creation would have two).
                if let Err(undo) = self.delete_schedule(&record.owner, &record.schedule_id).await {
                    tracing::error!(
                        schedule_id = record.schedule_id.as_str(),
                        error = %undo,
                        "taking back a schedule whose count could not be checked failed"
                    );
                }
                Err(err)
            }
        }
    }

    /// How many schedules `owner` has.
    async fn count_schedules(&self, owner: &Owner) -> Result<u32, StoreError> {
        let mut count = 0;
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
                .expression_attribute_values(":pk", s(schedules_pk(owner)))
                .expression_attribute_values(":prefix", s(SCHEDULE_SK_PREFIX))
                .select(Select::Count)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| AwsError::new("count schedules", e))?;
            count += page.count.max(0) as u32;
            match page.last_evaluated_key {
                Some(key) => start = Some(key),
                None => return Ok(count),
            }
        }
    }

    /// A page of at most `limit` schedules of shard `shard` after `after`, from the status
    /// index (every schedule, whoever owns it): what the repair sweep walks.
    pub async fn schedule_entries(
        &self,
        shard: u32,
        after: Option<&ScheduleId>,
        limit: u32,
    ) -> Result<ScheduleEntries, StoreError> {
        let bucket = format!("{SCHEDULE_BUCKET}#{shard}");
        let mut query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(STATUS_INDEX)
            .key_condition_expression("gsi2pk = :bucket")
            .expression_attribute_values(":bucket", s(&bucket))
            .limit(limit.max(1) as i32);
        if let Some(after) = after {
            query = query
                .key_condition_expression("gsi2pk = :bucket AND gsi2sk > :after")
                .expression_attribute_values(":after", s(after.as_str()));
        }
        let page = query.send().await.map_err(|e| AwsError::new("list schedules to repair", e))?;
        let entries = page
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|item| {
                let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
                let corrupt = |reason: &str| StoreError::Corrupt {
                    key: format!("{bucket} entry {:?}", text("gsi2sk")),
                    reason: reason.into(),
                };
                Ok(ScheduleEntry {
                    owner: text("owner")
                        .and_then(|o| o.parse().ok())
                        .ok_or_else(|| corrupt("no readable owner"))?,
                    schedule_id: text("gsi2sk")
                        .and_then(|id| id.parse().ok())
                        .ok_or_else(|| corrupt("no readable schedule id"))?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let next = match page.last_evaluated_key {
            Some(_) => entries.last().map(|e| e.schedule_id.clone()),
            None => None,
        };
        Ok(ScheduleEntries { entries, next })
    }

    /// `owner`'s schedule `id`, if there is one (another owner's reads as none).
    pub async fn schedule(
        &self,
        owner: &Owner,
        id: &ScheduleId,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(schedule_key(owner, id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read schedule {id}"), e))?;
        read.item.map(from_item).transpose()
    }

    /// A page of at most `limit` of `owner`'s schedules after `after`, oldest first.
    pub async fn schedules(
        &self,
        owner: &Owner,
        limit: u32,
        after: Option<&ScheduleId>,
    ) -> Result<SchedulePage, StoreError> {
        let page = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
            .expression_attribute_values(":pk", s(schedules_pk(owner)))
            .expression_attribute_values(":prefix", s(SCHEDULE_SK_PREFIX))
            .set_exclusive_start_key(after.map(|id| schedule_key(owner, id)))
            .limit(limit.max(1) as i32)
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("list schedules", e))?;
        let schedules: Vec<ScheduleRecord> =
            page.items.unwrap_or_default().into_iter().map(from_item).collect::<Result<_, _>>()?;
        let next = match page.last_evaluated_key {
            Some(_) => schedules.last().map(|last| last.schedule_id.clone()),
            None => None,
        };
        Ok(SchedulePage { schedules, next })
    }

    /// Writes `record` (its spec and state as changed by the caller, its `version` already
    /// bumped) if the stored one is still at version `read`; otherwise
    /// [`ScheduleWrite::Conflict`] with what is stored now. The firing's attributes are kept
    /// as stored: a firing between the read and this write is not undone.
    pub async fn replace_schedule(
        &self,
        record: &ScheduleRecord,
        read: u64,
    ) -> Result<ScheduleWrite, StoreError> {
        let spec = to_item(record);
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(schedule_key(&record.owner, &record.schedule_id)))
            .condition_expression("#version = :read")
            .expression_attribute_values(":read", AttributeValue::N(read.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let mut set = Vec::new();
        let mut remove = Vec::new();
        for (i, name) in SPEC_ATTRIBUTES.iter().enumerate() {
            update = update.expression_attribute_names(format!("#a{i}"), *name);
            match spec.get(*name) {
                Some(value) => {
                    set.push(format!("#a{i} = :a{i}"));
                    update = update.expression_attribute_values(format!(":a{i}"), value.clone());
                }
                None => remove.push(format!("#a{i}")),
            }
        }
        let mut expression = format!("SET {}", set.join(", "));
        if !remove.is_empty() {
            expression.push_str(&format!(" REMOVE {}", remove.join(", ")));
        }
        let written = update
            .update_expression(expression)
            .expression_attribute_names("#version", "version")
            .send()
            .await;
        match written {
            Ok(_) => Ok(ScheduleWrite::Written),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    let current = failed.item().cloned().map(from_item).transpose()?;
                    Ok(ScheduleWrite::Conflict(current.map(Box::new)))
                }
                _ => {
                    Err(AwsError::new(format!("write schedule {}", record.schedule_id), err).into())
                }
            },
        }
    }

    /// Deletes `owner`'s schedule `id`; whether there was one.
    pub async fn delete_schedule(
        &self,
        owner: &Owner,
        id: &ScheduleId,
    ) -> Result<bool, StoreError> {
        self.delete_key(schedule_key(owner, id), &format!("schedule {id}")).await
    }

    /// Records a firing of `owner`'s schedule `id`: its tick, `last_fire` and counts, the
    /// job it submitted as the live one (a tick held for the previous one is then dropped:
    /// superseded), a held tick — a tick only if no later or equal tick was recorded, a
    /// trigger only if it was not recorded already ([`FireWrite::Stale`] otherwise).
    pub async fn record_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<FireWrite, StoreError> {
        let (counter, last_fire) = fire.attributes();
        // A tick is recorded only after the ticks before it; a trigger only once.
        let (mark, condition) = if fire.trigger {
            (
                "last_trigger = :tick",
                "attribute_exists(pk) AND (attribute_not_exists(last_trigger) OR last_trigger <> :tick)",
            )
        } else {
            (
                "last_tick = :tick",
                "attribute_exists(pk) AND (attribute_not_exists(last_tick) OR last_tick < :tick)",
            )
        };
        let mut set = vec![mark, "last_fire = :fire"];
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(schedule_key(owner, id)))
            .condition_expression(condition)
            .expression_attribute_values(":tick", s(fire.tick.to_string()))
            .expression_attribute_values(":fire", last_fire)
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(job_id) = &fire.job_id {
            set.push("live_job = :job");
            update = update.expression_attribute_values(":job", s(job_id.as_str()));
        }
        let mut remove = "";
        if fire.hold {
            set.push("held = :tick");
        } else if fire.outcome == FireOutcome::Submitted {
            // A newer job is live: a tick held for the one before is superseded.
            remove = " REMOVE held";
        }
        let written = update
            .update_expression(format!(
                "SET {}{remove} ADD fired :one, {counter} :one",
                set.join(", ")
            ))
            .send()
            .await;
        match written {
            Ok(_) => Ok(FireWrite::Recorded),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    let later = !fire.trigger
                        && failed
                            .item()
                            .and_then(|old| old.get("last_tick"))
                            .and_then(|last| last.as_s().ok())
                            .and_then(|last| last.parse::<Timestamp>().ok())
                            .is_some_and(|last| last > fire.tick);
                    Ok(if later { FireWrite::Superseded } else { FireWrite::Stale })
                }
                _ => Err(AwsError::new(format!("record a firing of schedule {id}"), err).into()),
            },
        }
    }

    /// Counts `fire` in `owner`'s schedule `id`'s counts without making it the last firing —
    /// for a tick whose record was [`FireWrite::Superseded`] but whose job was made; whether
    /// the schedule is still there.
    pub async fn count_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError> {
        let (counter, _) = fire.attributes();
        let written = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(schedule_key(owner, id)))
            .condition_expression("attribute_exists(pk)")
            .update_expression(format!("ADD fired :one, {counter} :one"))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await;
        match written {
            Ok(_) => Ok(true),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(AwsError::new(format!("count a firing of schedule {id}"), err).into()),
            },
        }
    }

    /// Records the release of the held tick `fire.tick` of `owner`'s schedule `id` (its job
    /// submitted, or refused: counted so instead of skipped) and clears it, if it is still the
    /// held one; whether it was.
    pub async fn release_held(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError> {
        let (counter, last_fire) = fire.attributes();
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(schedule_key(owner, id)))
            .condition_expression("held = :tick")
            .expression_attribute_values(":tick", s(fire.tick.to_string()))
            .expression_attribute_values(":fire", last_fire)
            .expression_attribute_values(":one", AttributeValue::N("1".into()));
        let mut set = "SET last_fire = :fire".to_owned();
        if let Some(job_id) = &fire.job_id {
            set.push_str(", live_job = :job");
            update = update.expression_attribute_values(":job", s(job_id.as_str()));
        }
        let written = update
            .expression_attribute_values(":minus", AttributeValue::N("-1".into()))
            // The held tick was counted skipped; it is now submitted (or refused) instead.
            .update_expression(format!("{set} REMOVE held ADD {counter} :one, skipped :minus"))
            .send()
            .await;
        match written {
            Ok(_) => Ok(true),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(AwsError::new(format!("release the held tick of {id}"), err).into()),
            },
        }
    }
}

/// The attributes a spec or state change writes ([`JobStore::replace_schedule`]); the rest
/// (keys, id, owner, creation, the firing's) stay as stored.
const SPEC_ATTRIBUTES: [&str; 15] = [
    "type",
    "params",
    "callback_url",
    "priority",
    "schedule",
    "timezone",
    "overlap",
    "start_at",
    "end_at",
    "pause_on_failure",
    "state",
    "paused_reason",
    "paused_by_job",
    "updated_at",
    "version",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_attribute_is_a_records_attribute() {
        let now = Timestamp::now();
        let record = ScheduleRecord {
            callback_url: Some("https://example.com/hook".into()),
            priority: Priority::High,
            overlap: Overlap::Allow,
            start_at: Some(now),
            end_at: Some(now),
            pause_on_failure: true,
            state: ScheduleState::Paused,
            paused_reason: Some("by its owner".into()),
            paused_by_job: Some(JobId::new()),
            held: Some(now),
            ..ScheduleRecord::new(
                "alice".parse().unwrap(),
                "demo".into(),
                serde_json::json!({}),
                "rate(5 minutes)".parse().unwrap(),
                "UTC".parse().unwrap(),
                now,
            )
        };
        let item = to_item(&record);
        for name in SPEC_ATTRIBUTES {
            assert!(item.contains_key(name), "{name} is not an attribute of the record");
        }
    }
}
