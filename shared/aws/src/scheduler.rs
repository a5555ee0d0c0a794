//! EventBridge Scheduler: each longhaul schedule's twin, which fires it.
//!
//! One Scheduler schedule per longhaul schedule, named by its id, in the deployment's group
//! (`SCHEDULE_GROUP`), with the same expression, time zone, start and end, enabled while the
//! schedule is. Its target is the schedule firing queue (`SCHEDULE_QUEUE_ARN`), sent as the
//! role Scheduler assumes (`SCHEDULER_ROLE_ARN`), with a [`ScheduleFiring`] as the message:
//! the schedule's owner and id, and the tick's time from Scheduler's
//! `<aws.scheduler.scheduled-time>` context attribute. Delivery is retried by Scheduler for
//! at most [`MAX_EVENT_AGE_SECONDS`] (past that, a firing would be skipped as too late
//! anyway: `longhaul_domain::schedules::CATCH_UP_SECONDS`), and what it cannot deliver goes
//! to `SCHEDULE_DLQ_ARN`. The table's record is the source of truth; a twin is rewritten
//! from it whole on every change ([`Scheduler::put`]).

use crate::client::LazyClient;
use aws_sdk_scheduler::error::ProvideErrorMetadata;
use aws_sdk_scheduler::types::{
    DeadLetterConfig, FlexibleTimeWindow, FlexibleTimeWindowMode, RetryPolicy, ScheduleState,
    Target,
};
use longhaul_domain::{JobId, JobStatus, Timestamp};
use serde::{Deserialize, Serialize};

use crate::AwsError;

/// How long Scheduler keeps retrying the delivery of a firing (its retry policy's maximum
/// event age): the catch-up window, after which the firing would be skipped as too late.
pub const MAX_EVENT_AGE_SECONDS: i32 = 3_600;
/// Scheduler's delivery retries within that age.
pub const MAX_RETRY_ATTEMPTS: i32 = 100;
/// The placeholder Scheduler replaces with the tick's time in the target's input.
pub const SCHEDULED_TIME: &str = "<aws.scheduler.scheduled-time>";

/// The message a firing delivers to the schedule queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleFiring {
    /// The schedule's owner.
    pub owner: String,
    /// The schedule's id.
    pub schedule_id: String,
    /// The tick's time (RFC 3339), or [`SCHEDULED_TIME`] in a twin's template.
    pub scheduled_at: String,
    /// What the firing is, beyond a tick of the expression.
    #[serde(default, skip_serializing_if = "FiringKind::is_tick")]
    pub kind: FiringKind,
    /// For [`FiringKind::Ended`]: the job that ended,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<JobId>,
    /// and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<JobStatus>,
}

/// Why a firing was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FiringKind {
    /// A tick of the schedule's expression (sent by its twin).
    #[default]
    Tick,
    /// `POST /schedules/{id}/trigger`: fire now, even while paused.
    Trigger,
    /// A job of the schedule ended (`scheduled_at` is its tick): a `buffer_one` schedule's
    /// held tick is submitted now, and a `pause_on_failure` schedule whose job failed pauses.
    Ended,
}

impl FiringKind {
    fn is_tick(&self) -> bool {
        *self == FiringKind::Tick
    }
}

/// A twin as written: everything Scheduler fires a longhaul schedule by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Twin {
    /// Its name: the schedule's id.
    pub name: String,
    /// `cron(…)` or `rate(…)`.
    pub expression: String,
    /// The IANA time zone.
    pub timezone: String,
    /// No tick before.
    pub start_at: Option<Timestamp>,
    /// No tick after.
    pub end_at: Option<Timestamp>,
    /// Whether it fires.
    pub enabled: bool,
    /// The firing it sends ([`ScheduleFiring`] with [`SCHEDULED_TIME`]).
    pub input: String,
}

impl Twin {
    /// The twin that fires `record`, as the record says it should be.
    pub fn of(record: &crate::jobs::ScheduleRecord) -> Twin {
        Twin {
            name: record.schedule_id.to_string(),
            expression: record.schedule.to_string(),
            timezone: record.timezone.to_string(),
            start_at: record.start_at.map(whole_seconds),
            end_at: record.end_at.map(whole_seconds),
            enabled: record.state == longhaul_domain::schedules::ScheduleState::Enabled,
            input: Twin::input_for(&record.owner, &record.schedule_id),
        }
    }

    /// The firing message template of `owner`'s schedule `id`.
    pub fn input_for(owner: &str, id: &str) -> String {
        serde_json::to_string(&ScheduleFiring {
            owner: owner.to_owned(),
            schedule_id: id.to_owned(),
            scheduled_at: SCHEDULED_TIME.to_owned(),
            kind: FiringKind::Tick,
            job_id: None,
            status: None,
        })
        .expect("a firing always serialises")
    }
}

/// Where twins live and what they fire.
#[derive(Debug, Clone)]
pub struct SchedulerTarget {
    /// The schedule group (`SCHEDULE_GROUP`).
    pub group: String,
    /// The schedule queue's ARN (`SCHEDULE_QUEUE_ARN`).
    pub queue_arn: String,
    /// The role Scheduler sends as (`SCHEDULER_ROLE_ARN`).
    pub role_arn: String,
    /// Where undeliverable firings go (`SCHEDULE_DLQ_ARN`).
    pub dead_letter_arn: String,
}

impl SchedulerTarget {
    /// Reads `SCHEDULE_GROUP`, `SCHEDULE_QUEUE_ARN`, `SCHEDULER_ROLE_ARN`, `SCHEDULE_DLQ_ARN`.
    pub fn from_vars(vars: &crate::config::Vars) -> Result<Self, crate::config::ConfigError> {
        Ok(SchedulerTarget {
            group: vars.required("SCHEDULE_GROUP")?,
            queue_arn: vars.required("SCHEDULE_QUEUE_ARN")?,
            role_arn: vars.required("SCHEDULER_ROLE_ARN")?,
            dead_letter_arn: vars.required("SCHEDULE_DLQ_ARN")?,
        })
    }
}

/// `builder` (a `CreateSchedule` or an `UpdateSchedule`: two SDK types with the same setters)
/// with everything of `twin` that `scheduler` writes: each write is the whole twin.
macro_rules! with_twin {
    ($builder:expr, $scheduler:expr, $twin:expr) => {{
        let (start, end) = $scheduler.window($twin);
        $builder
            .group_name(&$scheduler.target.group)
            .name(&$twin.name)
            .schedule_expression(&$twin.expression)
            .schedule_expression_timezone(&$twin.timezone)
            .set_start_date(start)
            .set_end_date(end)
            .state(state_of($twin))
            .flexible_time_window(window_off())
            .target($scheduler.target(&$twin.input))
    }};
}

/// The EventBridge Scheduler adapter.
#[derive(Debug, Clone)]
pub struct Scheduler {
    client: LazyClient<aws_sdk_scheduler::Client>,
    target: SchedulerTarget,
}

impl Scheduler {
    /// An adapter writing twins into `target.group`.
    pub fn new(
        client: impl Into<LazyClient<aws_sdk_scheduler::Client>>,
        target: SchedulerTarget,
    ) -> Self {
        Scheduler { client: client.into(), target }
    }

    fn target(&self, input: &str) -> Target {
        Target::builder()
            .arn(&self.target.queue_arn)
            .role_arn(&self.target.role_arn)
            .input(input)
            .retry_policy(
                RetryPolicy::builder()
                    .maximum_event_age_in_seconds(MAX_EVENT_AGE_SECONDS)
                    .maximum_retry_attempts(MAX_RETRY_ATTEMPTS)
                    .build(),
            )
            .dead_letter_config(
                DeadLetterConfig::builder().arn(&self.target.dead_letter_arn).build(),
            )
            .build()
            .expect("a target has an ARN and a role")
    }

    /// Writes `twin` whole: updates the schedule of its name, or creates it if there is none.
    /// A `start_at` already past is not sent (Scheduler refuses a start more than five minutes
    /// ago; a schedule past its start simply fires from now).
    pub async fn put(&self, twin: &Twin) -> Result<(), AwsError> {
        // Update, else create; a create that finds it made meanwhile (by another write of the
        // same schedule: every write is the whole twin from the record) updates again.
        for _ in 0..3 {
            if self.update(twin).await? || self.create(twin).await? {
                return Ok(());
            }
        }
        Err(AwsError {
            context: format!("write schedule {}", twin.name),
            detail: "it kept being created and deleted by other writes".into(),
            refusal: None,
        })
    }

    fn window(
        &self,
        twin: &Twin,
    ) -> (Option<aws_smithy_types::DateTime>, Option<aws_smithy_types::DateTime>) {
        let date = |at: Option<Timestamp>| {
            at.map(|at| {
                aws_smithy_types::DateTime::from_millis(at.as_datetime().timestamp_millis())
            })
        };
        (date(twin.start_at.filter(|at| *at > Timestamp::now())), date(twin.end_at))
    }

    /// Updates the twin's schedule; `false` if there is none.
    pub async fn update(&self, twin: &Twin) -> Result<bool, AwsError> {
        let updated = with_twin!(self.client.update_schedule(), self, twin).send().await;
        match updated {
            Ok(_) => Ok(true),
            Err(err) if err.code() == Some("ResourceNotFoundException") => Ok(false),
            Err(err) => Err(AwsError::new(format!("update schedule {}", twin.name), err)),
        }
    }

    /// Creates the twin's schedule; `false` if it exists already.
    async fn create(&self, twin: &Twin) -> Result<bool, AwsError> {
        let created = with_twin!(self.client.create_schedule(), self, twin).send().await;
        match created {
            Ok(_) => Ok(true),
            Err(err) if err.code() == Some("ConflictException") => Ok(false),
            Err(err) => Err(AwsError::new(format!("create schedule {}", twin.name), err)),
        }
    }

    /// Deletes the twin named `name`; whether there was one.
    pub async fn delete(&self, name: &str) -> Result<bool, AwsError> {
        let deleted =
            self.client.delete_schedule().group_name(&self.target.group).name(name).send().await;
        match deleted {
            Ok(_) => Ok(true),
            Err(err) if err.code() == Some("ResourceNotFoundException") => Ok(false),
            Err(err) => Err(AwsError::new(format!("delete schedule {name}"), err)),
        }
    }

    /// A page of the names of the twins in the group, and the token of the next page.
    pub async fn names(
        &self,
        token: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), AwsError> {
        let page = self
            .client
            .list_schedules()
            .group_name(&self.target.group)
            .set_next_token(token)
            .max_results(100)
            .send()
            .await
            .map_err(|e| AwsError::new("list schedules", e))?;
        let names = page.schedules().iter().filter_map(|s| s.name().map(str::to_owned)).collect();
        Ok((names, page.next_token().map(str::to_owned)))
    }

    /// The twin named `name` as Scheduler holds it, if there is one.
    pub async fn get(&self, name: &str) -> Result<Option<Twin>, AwsError> {
        let read =
            self.client.get_schedule().group_name(&self.target.group).name(name).send().await;
        let output = match read {
            Ok(output) => output,
            Err(err) if err.code() == Some("ResourceNotFoundException") => return Ok(None),
            Err(err) => return Err(AwsError::new(format!("read schedule {name}"), err)),
        };
        let timestamp = |at: Option<&aws_smithy_types::DateTime>| {
            at.and_then(|at| chrono::DateTime::from_timestamp_millis(at.to_millis().ok()?))
                .map(Timestamp::from)
        };
        Ok(Some(Twin {
            name: name.to_owned(),
            expression: output.schedule_expression().unwrap_or_default().to_owned(),
            timezone: output.schedule_expression_timezone().unwrap_or("UTC").to_owned(),
            start_at: timestamp(output.start_date()),
            end_at: timestamp(output.end_date()),
            enabled: output.state() != Some(&ScheduleState::Disabled),
            input: output.target().and_then(|t| t.input()).unwrap_or_default().to_owned(),
        }))
    }
}

/// `at` to the whole second: Scheduler keeps a schedule's start and end to the second.
pub fn whole_seconds(at: Timestamp) -> Timestamp {
    use chrono::SubsecRound;
    Timestamp::from(at.as_datetime().trunc_subsecs(0))
}

fn state_of(twin: &Twin) -> ScheduleState {
    if twin.enabled { ScheduleState::Enabled } else { ScheduleState::Disabled }
}

fn window_off() -> FlexibleTimeWindow {
    FlexibleTimeWindow::builder()
        .mode(FlexibleTimeWindowMode::Off)
        .build()
        .expect("a window has a mode")
}

impl Twin {
    /// Whether this twin, as Scheduler holds it, fires as `expected` (a record's twin) says: the
    /// same in everything, a start already past counting as none (it is not sent once past).
    pub fn fires_as(&self, expected: &Twin) -> bool {
        let now = Timestamp::now();
        let start = |twin: &Twin| twin.start_at.filter(|at| *at > now);
        Twin { start_at: start(self), ..self.clone() }
            == Twin { start_at: start(expected), ..expected.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_twins_input_is_a_firing_with_schedulers_placeholder() {
        let input = Twin::input_for("alice", "0194c0de-0000-7000-8000-000000000000");
        let firing: ScheduleFiring = serde_json::from_str(&input).unwrap();
        assert_eq!(firing.scheduled_at, SCHEDULED_TIME);
        assert_eq!(firing.kind, FiringKind::Tick);
        assert!(!input.contains("kind"), "a tick's message carries no kind: {input}");
        let filled = input.replace(SCHEDULED_TIME, "2026-11-26T02:00:00Z");
        let firing: ScheduleFiring = serde_json::from_str(&filled).unwrap();
        assert_eq!(firing.scheduled_at, "2026-11-26T02:00:00Z");
        assert!(serde_json::from_str::<ScheduleFiring>(r#"{"owner":"a"}"#).is_err());
    }
}
