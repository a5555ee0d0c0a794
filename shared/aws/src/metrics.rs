//! CloudWatch metrics as Embedded Metric Format: one JSON line on stdout per data point,
//! which Lambda's log pipeline turns into metrics (no API call, no extra latency).

use longhaul_domain::JobId;
use std::sync::OnceLock;

use serde_json::json;

use crate::jobs::{JobIdentity, JobRecord};

/// Something that also receives every EMF line (the local stack records them for tests).
pub type Sink = Box<dyn Fn(&str) + Send + Sync>;

static SINK: OnceLock<Sink> = OnceLock::new();

/// Installs the process's extra receiver of EMF lines (first call wins; Lambda has none).
pub fn set_sink(sink: Sink) -> bool {
    SINK.set(sink).is_ok()
}

/// The metrics namespace.
pub const NAMESPACE: &str = "longhaul";

/// Units used by longhaul's metrics.
#[derive(Debug, Clone, Copy)]
pub enum Unit {
    /// A count.
    Count,
    /// Milliseconds.
    Milliseconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Count => "Count",
            Unit::Milliseconds => "Milliseconds",
        }
    }
}

/// Every metric longhaul emits: one name per meaning, each with its unit, so that the names
/// alarms and dashboards (template.yaml, the runbook) refer to are defined once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// A job was accepted (not counted for idempotent replays).
    JobsSubmitted,
    /// A job ended `succeeded`.
    JobsSucceeded,
    /// A job ended `failed`.
    JobsFailed,
    /// A job ended `cancelled`.
    JobsCancelled,
    /// Submission to end of a job (ms).
    JobDuration,
    /// Submission to first claim of a job (ms).
    QueueWait,
    /// A succeeded job's result expired.
    JobsExpired,
    /// A job failed because its retries were spent (the reaper's dead-letter count).
    JobsDeadLettered,
    /// The reaper flagged a job stalled (heartbeats, no progress).
    StalledJobs,
    /// The reaper rescued a job whose worker died.
    ZombiesReaped,
    /// An attempt failed transiently and the job's next attempt was scheduled.
    RetriesScheduled,
    /// A webhook was delivered.
    WebhookDelivered,
    /// A webhook delivery failed for good.
    WebhookFailed,
    /// A webhook endpoint was disabled (it answered `410 Gone`, or every attempt failed for
    /// the deployment's `EndpointDisableAfterSeconds`).
    WebhookEndpointDisabled,
    /// Live jobs by status (a gauge the reaper counts each run, within a cap of index pages:
    /// exact, or a lower bound when [`Metric::ActiveJobsTruncated`] says so).
    ActiveJobs,
    /// Beside each [`Metric::ActiveJobs`] reading: 1 when the count stopped at its page cap or
    /// the run's budget before the end of the bucket (the reading is a lower bound), 0 when it
    /// is exact.
    ActiveJobsTruncated,
    /// A schedule's tick submitted a job.
    ScheduleTicksSubmitted,
    /// A schedule's tick was skipped (overlap, paused, too late).
    ScheduleTicksSkipped,
    /// A schedule's tick was refused (a limit, a kind or params refused): the schedule's
    /// owner is missing jobs they expect.
    ScheduleTicksRefused,
    /// A job a schedule submitted failed (counted when its end reaches the schedule).
    ScheduledJobsFailed,
    /// An undo was given up (a fatal error, or its retries spent): what its stage did stays
    /// done, and someone must look (the job's `compensation` says which stage and why).
    UndosFailed,
}

impl Metric {
    /// Every metric.
    pub const ALL: [Metric; 21] = [
        Metric::JobsSubmitted,
        Metric::JobsSucceeded,
        Metric::JobsFailed,
        Metric::JobsCancelled,
        Metric::JobDuration,
        Metric::QueueWait,
        Metric::JobsExpired,
        Metric::JobsDeadLettered,
        Metric::StalledJobs,
        Metric::ZombiesReaped,
        Metric::RetriesScheduled,
        Metric::WebhookDelivered,
        Metric::WebhookFailed,
        Metric::WebhookEndpointDisabled,
        Metric::ActiveJobs,
        Metric::ActiveJobsTruncated,
        Metric::ScheduleTicksSubmitted,
        Metric::ScheduleTicksSkipped,
        Metric::ScheduleTicksRefused,
        Metric::ScheduledJobsFailed,
        Metric::UndosFailed,
    ];

    /// Its CloudWatch name.
    pub fn name(self) -> &'static str {
        match self {
            Metric::JobsSubmitted => "JobsSubmitted",
            Metric::JobsSucceeded => "JobsSucceeded",
            Metric::JobsFailed => "JobsFailed",
            Metric::JobsCancelled => "JobsCancelled",
            Metric::JobDuration => "JobDuration",
            Metric::QueueWait => "QueueWait",
            Metric::JobsExpired => "JobsExpired",
            Metric::JobsDeadLettered => "JobsDeadLettered",
            Metric::StalledJobs => "StalledJobs",
            Metric::ZombiesReaped => "ZombiesReaped",
            Metric::RetriesScheduled => "RetriesScheduled",
            Metric::WebhookDelivered => "WebhookDelivered",
            Metric::WebhookFailed => "WebhookFailed",
            Metric::WebhookEndpointDisabled => "WebhookEndpointDisabled",
            Metric::ActiveJobs => "ActiveJobs",
            Metric::ActiveJobsTruncated => "ActiveJobsTruncated",
            Metric::ScheduleTicksSubmitted => "ScheduleTicksSubmitted",
            Metric::ScheduleTicksSkipped => "ScheduleTicksSkipped",
            Metric::ScheduleTicksRefused => "ScheduleTicksRefused",
            Metric::ScheduledJobsFailed => "ScheduledJobsFailed",
            Metric::UndosFailed => "UndosFailed",
        }
    }

    /// Its unit.
    pub fn unit(self) -> Unit {
        match self {
            Metric::JobDuration | Metric::QueueWait => Unit::Milliseconds,
            _ => Unit::Count,
        }
    }
}

/// The EMF line for one data point of `name` about one job: dimensioned by its type, with its
/// id as a plain property (not a dimension: one metric per job would be costly and useless, but
/// the property lets Logs Insights find the job behind any data point).
pub fn line(name: &str, value: f64, unit: Unit, job_type: &str, job_id: &JobId) -> String {
    // Per job type, and the total (alarms cannot aggregate over a dimension).
    envelope(
        name,
        value,
        unit,
        json!([["JobType"], []]),
        json!({"JobType": job_type, "job_id": job_id}),
    )
}

/// The EMF line for one reading of a gauge `name` (a count of jobs) in status `status`,
/// dimensioned by `Status` only: it is about the whole table, not one job.
pub fn status_line(name: &str, value: f64, status: &str) -> String {
    envelope(name, value, Unit::Count, json!([["Status"]]), json!({"Status": status}))
}

/// One EMF data point: `name = value` with its `dimensions` (sets of property names) and the
/// `properties` (an object) that carry them.
fn envelope(
    name: &str,
    value: f64,
    unit: Unit,
    dimensions: serde_json::Value,
    properties: serde_json::Value,
) -> String {
    let mut line = json!({
        "_aws": {
            "Timestamp": chrono::Utc::now().timestamp_millis(),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": dimensions,
                "Metrics": [{"Name": name, "Unit": unit.as_str()}],
            }],
        },
        name: value,
    });
    if let (Some(line), serde_json::Value::Object(properties)) = (line.as_object_mut(), properties)
    {
        line.extend(properties);
    }
    line.to_string()
}

/// Emits one data point of `metric` about `job`.
pub fn emit(metric: Metric, value: f64, job: &impl JobIdentity) {
    publish(&line(metric.name(), value, metric.unit(), job.job_type(), job.job_id()));
}

/// Counts one occurrence of `metric` about `job`.
pub fn count(metric: Metric, job: &impl JobIdentity) {
    emit(metric, 1.0, job);
}

/// Emits what a job's end counts, from its record as the ending write left it: `JobsSucceeded`,
/// `JobsFailed` or `JobsCancelled`, and `JobDuration` (submission to end). Whoever ends a job —
/// a stage, the reaper, a cancellation — calls this once, after its write took effect, so
/// every end is counted exactly once whichever path took it. Nothing for a live status.
pub fn emit_end(job: &JobRecord) {
    use longhaul_domain::JobStatus;
    let metric = match job.status {
        JobStatus::Succeeded => Metric::JobsSucceeded,
        JobStatus::Failed => Metric::JobsFailed,
        JobStatus::Cancelled => Metric::JobsCancelled,
        _ => return,
    };
    count(metric, job);
    if let Some(end) = job.finished_at {
        emit(Metric::JobDuration, end.since(job.created_at).as_millis() as f64, job);
    }
}

/// Counts one tick of schedule `schedule_id` (of jobs of `job_type`) as `metric`: per job type
/// and in total, with the schedule's id as a plain property.
pub fn count_tick(metric: Metric, job_type: &str, schedule_id: &str) {
    publish(&envelope(
        metric.name(),
        1.0,
        metric.unit(),
        json!([["JobType"], []]),
        json!({"JobType": job_type, "schedule_id": schedule_id}),
    ));
}

/// Emits one reading of gauge `metric` for status `status`.
pub fn emit_status(metric: Metric, value: f64, status: &str) {
    publish(&status_line(metric.name(), value, status));
}

fn publish(line: &str) {
    println!("{line}");
    if let Some(sink) = SINK.get() {
        sink(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_shape() {
        let id = JobId::new();
        let parsed: serde_json::Value =
            serde_json::from_str(&line("ZombiesReaped", 1.0, Unit::Count, "some_kind", &id))
                .unwrap();
        assert_eq!(parsed["ZombiesReaped"], 1.0);
        assert_eq!(parsed["JobType"], "some_kind");
        assert_eq!(parsed["job_id"], id.as_str());
        assert_eq!(parsed["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"], "ZombiesReaped");
        assert_eq!(parsed["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([["JobType"], []]));
        let gauge: serde_json::Value =
            serde_json::from_str(&status_line("ActiveJobs", 7.0, "running")).unwrap();
        assert_eq!(
            (gauge["ActiveJobs"].as_f64(), gauge["Status"].as_str()),
            (Some(7.0), Some("running"))
        );
        assert_eq!(gauge["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([["Status"]]));
    }

    #[test]
    fn metric_names_are_distinct() {
        let names: std::collections::BTreeSet<_> = Metric::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names.len(), Metric::ALL.len());
    }

    /// Every alarm on a longhaul metric names one the code emits (a renamed metric would
    /// leave its alarm silent forever).
    #[test]
    fn the_templates_alarms_watch_metrics_that_exist() {
        let template = include_str!("../../../template.yaml");
        let lines: Vec<&str> = template.lines().map(str::trim).collect();
        let watched: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0] == format!("Namespace: {NAMESPACE}"))
            .filter_map(|w| w[1].strip_prefix("MetricName: "))
            .collect();
        assert!(watched.len() >= 2, "the template's alarms were not found: {watched:?}");
        for name in watched {
            assert!(Metric::ALL.iter().any(|m| m.name() == name), "no metric {name}");
        }
    }
}
