//! EventBridge Scheduler, played locally. The functions write schedules into the template's
//! schedule groups in the emulator (through the edge, counted and IAM-checked); moto stores
//! them but fires nothing. This task fires them as Scheduler would:
//!
//! - every [`POLL`] it lists the schedules of the template's groups (`ListSchedules`, and
//!   `GetSchedule` for one new or changed since the last look — the emulator's side, so
//!   uncounted and unchecked);
//! - for each `ENABLED` schedule it fires every tick due since its last look, computed by
//!   `longhaul_domain::recurrence` from the schedule's expression, time zone, `StartDate` and
//!   `EndDate` (a rate anchored at its `StartDate`, else at its creation date as the emulator
//!   reports it): the target's `Input` with Scheduler's context attributes filled in (the tick's
//!   time, RFC 3339 in UTC to the second, for `<aws.scheduler.scheduled-time>`), sent to the
//!   target queue, as the schedule's role — which must be one of the template's, trust
//!   `scheduler.amazonaws.com` and grant `sqs:SendMessage` on the queue (a refusal is an IAM
//!   denial, as every other);
//! - one firing per tick: each look covers the time since the previous one, half-open, so no
//!   instant is covered twice; a schedule changed since the last look fires its old settings up
//!   to the change and its new ones after it;
//! - nothing from before the firer first saw the schedule, nor before the stack started (an
//!   emulator adopted by `make dev` keeps schedules whose missed ticks are not back-filled, as
//!   Scheduler back-fills nothing) — except the ticks since the schedule's last change, a
//!   look's lag at most: a rate schedule fires at its creation, as Scheduler's does;
//! - a firing the queue refuses goes to the target's dead-letter queue (no retries: the
//!   emulator's queues do not fail but when missing).
//!
//! `POST /_local/scheduler/{name}` fires a schedule's next tick now (tests need not wait for
//! the clock): the tick is the next one the firer would have fired, so it is never fired
//! twice. Only SQS targets are supported.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use longhaul_domain::recurrence::{Recurrence, ScheduleExpression, ScheduleTimeZone};
use serde::Serialize;

use crate::checks::iam::{Access, Policies, SCHEDULER_SERVICE};
use crate::hosting::edge::Denials;
use crate::stack::template::{ACCOUNT, Template};

/// How often the firer looks at the schedules: a tick fires within about this much of its time
/// (Scheduler's own precision is a minute).
pub const POLL: Duration = Duration::from_secs(1);
/// The context attribute Scheduler replaces with the tick's time in a target's `Input`.
pub const SCHEDULED_TIME: &str = "<aws.scheduler.scheduled-time>";
/// The most ticks of one schedule a look fires (more are due only after a long stall of the
/// host: the rest are logged and dropped).
const MAX_TICKS_PER_LOOK: usize = 100;

/// The firer of the template's schedule groups.
#[derive(Clone)]
pub struct Firer(Arc<Inner>);

struct Inner {
    scheduler: aws_sdk_scheduler::Client,
    sqs: aws_sdk_sqs::Client,
    groups: Vec<String>,
    queue_endpoint: String,
    policies: Arc<Policies>,
    denials: Denials,
    started: DateTime<Utc>,
    seen: tokio::sync::Mutex<HashMap<Key, Seen>>,
}

/// A schedule: its group and name.
type Key = (String, String);

/// What the firer knows of a schedule since its last look.
struct Seen {
    /// Its `LastModificationDate` then.
    modified: DateTime<Utc>,
    /// Its settings then (`None`: nothing the firer can fire).
    twin: Option<Arc<Twin>>,
    /// Every tick before this has been dealt with.
    until: DateTime<Utc>,
}

/// A schedule as the firer fires it.
#[derive(Debug)]
struct Twin {
    arn: String,
    recurrence: Recurrence,
    enabled: bool,
    target_arn: String,
    role_arn: String,
    input: String,
    dead_letter_arn: Option<String>,
}

/// One firing.
#[derive(Debug, Clone, Serialize)]
pub struct Fired {
    /// The schedule's group.
    pub group: String,
    /// Its name.
    pub name: String,
    /// The tick, as `<aws.scheduler.scheduled-time>` gave it.
    pub scheduled_at: String,
    /// The queue it was sent to (the target's, or its dead-letter queue's).
    pub queue_arn: String,
}

/// Why `POST /_local/scheduler/{name}` fired nothing.
#[derive(Debug, thiserror::Error)]
pub enum NotFired {
    /// No schedule of that name in the template's groups.
    #[error("no schedule {0} in the stack's schedule groups")]
    NotFound(String),
    /// The schedule is disabled: Scheduler fires nothing.
    #[error("schedule {0} is DISABLED")]
    Disabled(String),
    /// No tick is left in its window, or its expression or target is not one the firer fires.
    #[error("schedule {0} has no tick to fire: {1}")]
    NoTick(String, String),
    /// The emulator failed, or the firing could not be delivered.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl Firer {
    /// The firer of `template`'s schedule groups, reading and sending through the emulator's
    /// clients, judging each firing by `policies` (refusals go to `denials`).
    pub fn new(
        template: &Template,
        scheduler: aws_sdk_scheduler::Client,
        sqs: aws_sdk_sqs::Client,
        policies: Arc<Policies>,
        denials: Denials,
    ) -> anyhow::Result<Self> {
        let groups = template
            .of_type("AWS::Scheduler::ScheduleGroup")
            .map(|(logical, _)| template.physical_name(logical))
            .collect::<anyhow::Result<_>>()?;
        Ok(Firer(Arc::new(Inner {
            scheduler,
            sqs,
            groups,
            queue_endpoint: template.queue_endpoint.clone(),
            policies,
            denials,
            started: Utc::now(),
            seen: Default::default(),
        })))
    }

    /// Looks every [`POLL`] until the task is aborted (none if the template has no group).
    pub fn spawn(&self) -> Option<tokio::task::JoinHandle<()>> {
        if self.0.groups.is_empty() {
            return None;
        }
        let firer = self.clone();
        Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(POLL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                ticker.tick().await;
                match firer.look().await {
                    Ok(()) => failing = false,
                    Err(err) if !failing => {
                        failing = true;
                        tracing::warn!(error = %format!("{err:#}"), "the schedule firer could not look at the schedules; it tries again every second");
                    }
                    Err(_) => {}
                }
            }
        }))
    }

    /// One look: fires every tick due since the last.
    async fn look(&self) -> anyhow::Result<()> {
        let mut seen = self.0.seen.lock().await;
        let listed = self.list().await?;
        let now = Utc::now();
        let mut next = HashMap::new();
        for (key, modified) in listed {
            let previous = seen.remove(&key);
            let twin = match &previous {
                Some(p) if p.modified == modified => p.twin.clone(),
                _ => match self.read(&key).await {
                    Ok(Some((_, twin))) => twin,
                    Ok(None) => continue, // deleted since the listing
                    // Left as it was, to be read again at the next look (never seen afresh:
                    // that would fire its ticks since its change again).
                    Err(err) => {
                        tracing::warn!(schedule = key.1, error = %format!("{err:#}"), "the schedule firer could not read a schedule");
                        if let Some(previous) = previous {
                            next.insert(key, previous);
                        }
                        continue;
                    }
                },
            };
            let from = previous.as_ref().map_or(modified.max(self.0.started), |p| p.until);
            let changed = modified.min(now);
            match &previous {
                // Changed since the last look: the old settings fire up to the change.
                Some(p) if p.modified != modified && changed > from => {
                    self.fire_between(&key, p.twin.as_deref(), from, changed).await;
                    self.fire_between(&key, twin.as_deref(), changed, now).await;
                }
                _ => self.fire_between(&key, twin.as_deref(), from, now).await,
            }
            next.insert(key, Seen { modified, twin, until: from.max(now) });
        }
        *seen = next;
        Ok(())
    }

    /// Fires the next tick of the schedule `name` (in `group`, else in any of the template's
    /// groups) now: the first one the firer has not dealt with, even if it is not yet due.
    pub async fn fire_next(&self, name: &str, group: Option<&str>) -> Result<Fired, NotFired> {
        let mut seen = self.0.seen.lock().await;
        let groups: Vec<String> = match group {
            Some(group) => vec![group.to_owned()],
            None => self.0.groups.clone(),
        };
        let mut found = None;
        for group in groups {
            let key = (group, name.to_owned());
            if let Some(read) = self.read(&key).await? {
                found = Some((key, read));
                break;
            }
        }
        let Some((key, (modified, twin))) = found else {
            return Err(NotFired::NotFound(name.to_owned()));
        };
        let Some(twin) = twin else {
            return Err(NotFired::NoTick(
                name.into(),
                "its expression or target is not one the local firer fires".into(),
            ));
        };
        if !twin.enabled {
            return Err(NotFired::Disabled(name.to_owned()));
        }
        let from = seen.get(&key).map_or(modified.max(self.0.started), |s| s.until);
        let tick = twin
            .recurrence
            .next_from(from)
            .ok_or_else(|| NotFired::NoTick(name.into(), "its window has closed".into()))?;
        let fired = self.deliver(&key, &twin, tick).await?;
        let until = tick + TimeDelta::nanoseconds(1);
        seen.insert(key, Seen { modified, twin: Some(twin), until });
        Ok(fired)
    }

    /// Every schedule of the template's groups, with its `LastModificationDate`.
    async fn list(&self) -> anyhow::Result<Vec<(Key, DateTime<Utc>)>> {
        let mut out = Vec::new();
        for group in &self.0.groups {
            let mut token = None;
            loop {
                let page = self
                    .0
                    .scheduler
                    .list_schedules()
                    .group_name(group)
                    .max_results(100)
                    .set_next_token(token)
                    .send()
                    .await
                    .map_err(|e| {
                        anyhow!(aws_sdk_scheduler::error::DisplayErrorContext(e).to_string())
                    })
                    .with_context(|| format!("listing the schedules of {group}"))?;
                for summary in page.schedules() {
                    let (Some(name), Some(modified)) = (
                        summary.name(),
                        summary.last_modification_date().or(summary.creation_date()),
                    ) else {
                        continue;
                    };
                    out.push(((group.clone(), name.to_owned()), chrono_time(modified)));
                }
                token = page.next_token().filter(|t| !t.is_empty()).map(str::to_owned);
                if token.is_none() {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// The schedule `key` from the emulator: its `LastModificationDate` and its settings
    /// (`None` when the firer cannot fire it, with the reason logged); `None` if there is no
    /// such schedule.
    #[allow(clippy::type_complexity)]
    async fn read(
        &self,
        (group, name): &Key,
    ) -> anyhow::Result<Option<(DateTime<Utc>, Option<Arc<Twin>>)>> {
        let read = self.0.scheduler.get_schedule().group_name(group).name(name).send().await;
        let schedule = match read {
            Ok(schedule) => schedule,
            Err(err)
                if err.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                return Ok(None);
            }
            Err(err) => {
                return Err(anyhow!(
                    aws_sdk_scheduler::error::DisplayErrorContext(err).to_string()
                ))
                .with_context(|| format!("reading schedule {group}/{name}"));
            }
        };
        let modified = schedule
            .last_modification_date()
            .or(schedule.creation_date())
            .map(chrono_time)
            .unwrap_or_else(Utc::now);
        let twin = match twin(&schedule) {
            Ok(twin) => Some(Arc::new(twin)),
            Err(why) => {
                tracing::warn!(
                    schedule = format!("{group}/{name}"),
                    "the local firer does not fire this schedule: {why:#}"
                );
                None
            }
        };
        Ok(Some((modified, twin)))
    }

    /// Fires `twin`'s ticks in `[from, until)` (none if it is disabled or unknown).
    async fn fire_between(
        &self,
        key: &Key,
        twin: Option<&Twin>,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) {
        let Some(twin) = twin.filter(|t| t.enabled) else { return };
        if from >= until {
            return;
        }
        let due = twin.recurrence.fires_between(from, until, MAX_TICKS_PER_LOOK);
        if due.more {
            tracing::warn!(schedule = key.1, %from, %until, "more ticks are due than a look fires; the rest are dropped");
        }
        for tick in due.times {
            if let Err(err) = self.deliver(key, twin, tick).await {
                tracing::error!(schedule = key.1, %tick, error = %format!("{err:#}"), "a firing could not be delivered");
            }
        }
    }

    /// Sends `twin`'s firing for `tick` to its target queue as its role (or, if the queue
    /// refuses it, to its dead-letter queue).
    async fn deliver(&self, key: &Key, twin: &Twin, tick: DateTime<Utc>) -> anyhow::Result<Fired> {
        let scheduled_at = scheduled_time(tick);
        let body = twin
            .input
            .replace(SCHEDULED_TIME, &scheduled_at)
            .replace("<aws.scheduler.schedule-arn>", &twin.arn)
            .replace("<aws.scheduler.execution-id>", &uuid::Uuid::new_v4().to_string())
            .replace("<aws.scheduler.attempt-number>", "1");
        let fired = |queue_arn: &str| Fired {
            group: key.0.clone(),
            name: key.1.clone(),
            scheduled_at: scheduled_at.clone(),
            queue_arn: queue_arn.to_owned(),
        };
        let failure = match self.send(twin, &twin.target_arn, &body).await {
            Ok(()) => {
                tracing::info!(schedule = key.1, scheduled_at, "schedule fired");
                return Ok(fired(&twin.target_arn));
            }
            Err(failure) => failure,
        };
        let Some(dead_letters) = &twin.dead_letter_arn else {
            return Err(failure.context("no dead-letter queue: the firing is lost"));
        };
        tracing::warn!(schedule = key.1, scheduled_at, error = %format!("{failure:#}"), "a firing went to the schedule's dead-letter queue");
        self.send(twin, dead_letters, &body).await.context("sending to the dead-letter queue")?;
        Ok(fired(dead_letters))
    }

    /// Sends `body` to the queue `queue_arn` as `twin`'s role.
    async fn send(&self, twin: &Twin, queue_arn: &str, body: &str) -> anyhow::Result<()> {
        let url = self.queue_url(queue_arn)?;
        let verdict = self.0.policies.check_service_role(
            SCHEDULER_SERVICE,
            &twin.role_arn,
            &twin.arn,
            &[Access::send_message(queue_arn)],
        );
        if let Err(denial) = verdict {
            self.0.denials.record(denial.clone());
            return Err(anyhow!("AccessDenied: {}", denial.message));
        }
        self.0
            .sqs
            .send_message()
            .queue_url(url)
            .message_body(body)
            .send()
            .await
            .map_err(|e| anyhow!(aws_sdk_sqs::error::DisplayErrorContext(e).to_string()))
            .with_context(|| format!("sending to {queue_arn}"))?;
        Ok(())
    }

    /// The URL of the queue `arn` (SQS targets only).
    fn queue_url(&self, arn: &str) -> anyhow::Result<String> {
        match arn.split(':').collect::<Vec<_>>().as_slice() {
            ["arn", _, "sqs", _, account, name] => {
                Ok(format!("{}/{account}/{name}", self.0.queue_endpoint))
            }
            _ => {
                Err(anyhow!("target {arn} is not an SQS queue: the local firer sends to SQS only"))
            }
        }
    }
}

/// A schedule's settings as the firer needs them.
fn twin(
    schedule: &aws_sdk_scheduler::operation::get_schedule::GetScheduleOutput,
) -> anyhow::Result<Twin> {
    let expression: ScheduleExpression =
        schedule.schedule_expression().unwrap_or_default().parse().context("its expression")?;
    let timezone: ScheduleTimeZone = schedule
        .schedule_expression_timezone()
        .unwrap_or("UTC")
        .parse()
        .context("its time zone")?;
    let created = schedule.creation_date().map(chrono_time).context("no CreationDate")?;
    let recurrence = Recurrence::new(
        expression,
        timezone,
        created,
        schedule.start_date().map(chrono_time),
        schedule.end_date().map(chrono_time),
    )
    .context("its window")?;
    let target = schedule.target().context("no target")?;
    Ok(Twin {
        arn: schedule.arn().map(str::to_owned).unwrap_or_else(|| {
            format!(
                "arn:aws:scheduler:{}:{ACCOUNT}:schedule/{}/{}",
                crate::stack::template::REGION,
                schedule.group_name().unwrap_or("default"),
                schedule.name().unwrap_or_default()
            )
        }),
        recurrence,
        enabled: schedule.state() != Some(&aws_sdk_scheduler::types::ScheduleState::Disabled),
        target_arn: target.arn().to_owned(),
        role_arn: target.role_arn().to_owned(),
        input: target.input().unwrap_or_default().to_owned(),
        dead_letter_arn: target.dead_letter_config().and_then(|d| d.arn()).map(str::to_owned),
    })
}

/// `<aws.scheduler.scheduled-time>` of a tick: RFC 3339 in UTC, to the second
/// (`2026-11-26T02:00:00Z`).
pub fn scheduled_time(tick: DateTime<Utc>) -> String {
    tick.trunc_subsecs(0).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn chrono_time(at: &aws_smithy_types::DateTime) -> DateTime<Utc> {
    DateTime::from_timestamp(at.secs(), at.subsec_nanos()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticks_time_is_utc_to_the_second() {
        let tick = DateTime::parse_from_rfc3339("2026-11-26T03:00:00.987+01:00").unwrap().to_utc();
        assert_eq!(scheduled_time(tick), "2026-11-26T02:00:00Z");
    }
}
