//! The command line, as clap parses it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Submit and follow longhaul jobs.
#[derive(Debug, Parser)]
#[command(name = "longhaul", version, about, propagate_version = true)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// Base URL of the API (deployed: the HTTP API's URL with its stage).
    #[arg(long, env = "LONGHAUL_API", default_value = "http://127.0.0.1:3000", global = true)]
    pub api: String,
    /// Bearer token (a JWT whose `sub` is you).
    #[arg(long, env = "LONGHAUL_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print one JSON document on stdout instead of text (for scripts).
    #[arg(long, global = true)]
    pub json: bool,
    /// Say on stderr how `watch` follows the job (live stream, reconnects, polling).
    #[arg(short, long, global = true)]
    pub verbose: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a job (prints its id; with --wait, watches it to its end).
    Submit(Submit),
    /// Upload a file for a job to read (prints the `input` to name in params).
    Upload(Upload),
    /// Show a job.
    Status(JobRef),
    /// Follow a job with a live progress bar until it ends.
    Watch(JobRef),
    /// List your jobs, newest first.
    Ls(List),
    /// Cancel a job.
    Cancel(Cancel),
    /// Pause a job (a running one saves its checkpoint and stops at its next progress write).
    Pause(Cancel),
    /// Resume a paused job from its checkpoint.
    Resume(JobRef),
    /// Send a job a signal its stage waits for (or will).
    Signal(SignalArgs),
    /// Run a failed or cancelled job again, as a new job.
    Retry(JobRef),
    /// Download a succeeded job's result.
    Result(ResultArgs),
    /// Show a job's webhook delivery attempts.
    Deliveries(JobRef),
    /// List the job types this deployment accepts.
    JobTypes,
    /// Recurring jobs: create, list, show, pause, resume, trigger and remove schedules.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Webhook endpoints: create, list, show, change, enable and remove them; list, resend
    /// and recover their deliveries.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
}

/// `submit`.
#[derive(Debug, Args)]
pub struct Submit {
    /// The job type (see `longhaul job-types`).
    #[arg(value_name = "TYPE")]
    pub kind: String,
    /// The job's params: inline JSON, `@FILE` to read them from a file, or `@-` for stdin.
    #[arg(long, default_value = "{}")]
    pub params: String,
    /// Idempotency key (default: derived by the server from the request).
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Order among your waiting jobs.
    #[arg(long, value_enum)]
    pub priority: Option<Priority>,
    /// Watch the job until it ends; the exit code is then the job's.
    #[arg(long)]
    pub wait: bool,
}

/// A job's priority among its owner's waiting jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Priority {
    /// Before `normal` and `low`.
    High,
    /// The default.
    Normal,
    /// After `high` and `normal`.
    Low,
}

impl Priority {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// `upload`.
#[derive(Debug, Args)]
pub struct Upload {
    /// The file to upload.
    pub file: PathBuf,
    /// Its media type (default: from the extension, else application/octet-stream).
    #[arg(long)]
    pub content_type: Option<String>,
}

/// A command naming one job.
#[derive(Debug, Args)]
pub struct JobRef {
    /// The job id.
    pub id: String,
}

/// `ls`.
#[derive(Debug, Args)]
pub struct List {
    /// Only jobs in this status (pending, queued, running, paused, compensating, succeeded, failed, cancelled, expired).
    #[arg(long)]
    pub status: Option<String>,
    /// Only jobs of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub kind: Option<String>,
    /// Only the jobs this schedule submitted.
    #[arg(long, value_name = "SCHEDULE_ID")]
    pub schedule: Option<String>,
    /// At most this many jobs (pages are followed until there are this many).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Every job: follow `next_cursor` to the last page (ignores --limit).
    #[arg(long)]
    pub all: bool,
}

/// `cancel` and `pause`.
#[derive(Debug, Args)]
pub struct Cancel {
    /// The job id.
    pub id: String,
    /// Why (recorded on the job).
    #[arg(long)]
    pub reason: Option<String>,
}

/// `signal`.
#[derive(Debug, Args)]
pub struct SignalArgs {
    /// The job id.
    pub id: String,
    /// The signal's name.
    pub name: String,
    /// Its payload: JSON inline, or `@file` (default: none).
    #[arg(long)]
    pub payload: Option<String>,
}

/// `result`.
#[derive(Debug, Args)]
pub struct ResultArgs {
    /// The job id.
    pub id: String,
    /// Write the result to this file (default: stdout).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `schedule …`.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule (prints its id).
    Create(ScheduleCreate),
    /// List your schedules, oldest first.
    #[command(visible_alias = "list")]
    Ls(Pages),
    /// Show a schedule: its spec, state, next and last fire, counts, and its recent jobs.
    Show(ScheduleRef),
    /// Pause a schedule: no tick fires until it is resumed.
    Pause(SchedulePause),
    /// Resume a paused schedule (from its next tick; missed ticks are not made up).
    Resume(ScheduleRef),
    /// Fire a schedule now (even while paused), under its overlap rule.
    Trigger(ScheduleTrigger),
    /// Delete a schedule (its jobs are kept).
    #[command(visible_alias = "delete")]
    Rm(ScheduleRef),
}

/// `schedule create`.
#[derive(Debug, Args)]
pub struct ScheduleCreate {
    /// The job type each tick submits (see `longhaul job-types`).
    #[arg(long = "type", value_name = "TYPE")]
    pub kind: String,
    /// The job's params: inline JSON, `@FILE` to read them from a file, or `@-` for stdin.
    #[arg(long, default_value = "{}")]
    pub params: String,
    /// When it fires, in EventBridge Scheduler's syntax: `cron(0 2 * * ? *)` or
    /// `rate(15 minutes)`.
    #[arg(long, value_name = "EXPRESSION")]
    pub schedule: String,
    /// The IANA time zone a cron expression is read in (default UTC).
    #[arg(long, value_name = "ZONE")]
    pub timezone: Option<String>,
    /// A tick while its previous job is live: skip it (default), hold one until that job
    /// ends, or submit anyway.
    #[arg(long, value_enum)]
    pub overlap: Option<Overlap>,
    /// Each job's terminal event is delivered to this URL.
    #[arg(long, value_name = "URL")]
    pub callback_url: Option<String>,
    /// Each job's order among your waiting jobs.
    #[arg(long, value_enum)]
    pub priority: Option<Priority>,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// No tick before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub start_at: Option<String>,
    /// No tick after this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub end_at: Option<String>,
    /// Pause the schedule when one of its jobs fails.
    #[arg(long)]
    pub pause_on_failure: bool,
}

/// A schedule's rule for a tick that comes while its previous job is live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Overlap {
    /// Record the tick as skipped (the default).
    Skip,
    /// Hold one tick and submit it when the live job ends.
    #[value(name = "buffer_one", alias = "buffer-one")]
    BufferOne,
    /// Submit anyway.
    Allow,
}

impl Overlap {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
            Overlap::Allow => "allow",
        }
    }
}

/// A listing's size.
#[derive(Debug, Args)]
pub struct Pages {
    /// At most this many (pages are followed until there are this many).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Every one: follow `next_cursor` to the last page (ignores --limit).
    #[arg(long)]
    pub all: bool,
}

/// A command naming one schedule.
#[derive(Debug, Args)]
pub struct ScheduleRef {
    /// The schedule id.
    pub id: String,
}

/// `schedule pause`.
#[derive(Debug, Args)]
pub struct SchedulePause {
    /// The schedule id.
    pub id: String,
    /// Why (shown as the schedule's `paused_reason`).
    #[arg(long)]
    pub reason: Option<String>,
}

/// `schedule trigger`.
#[derive(Debug, Args)]
pub struct ScheduleTrigger {
    /// The schedule id.
    pub id: String,
    /// Wait for the tick's job and watch it to its end; the exit code is then the job's.
    #[arg(long)]
    pub wait: bool,
}

/// `endpoint …`.
#[derive(Debug, Subcommand)]
pub enum EndpointCommand {
    /// Create a webhook endpoint (prints its id).
    Create(EndpointCreate),
    /// List your webhook endpoints: status, URL, events, and why one is failing or disabled.
    #[command(visible_alias = "list")]
    Ls,
    /// Show a webhook endpoint (its JSON document).
    #[command(visible_alias = "show")]
    Get(EndpointRef),
    /// Change a webhook endpoint's URL, events or description.
    Update(EndpointUpdate),
    /// Delete a webhook endpoint (nothing is sent to it after the answer).
    #[command(visible_alias = "delete")]
    Rm(EndpointRef),
    /// Enable a disabled webhook endpoint (then `recover` sends what it missed).
    Enable(EndpointRef),
    /// List a webhook endpoint's deliveries, newest job first.
    Deliveries(EndpointDeliveries),
    /// Queue one delivery again (same `webhook-id`, so the receiver can deduplicate it).
    Resend(DeliveryRef),
    /// Queue again every failed delivery of an endpoint since a time (prints how many).
    Recover(EndpointRecover),
}

/// An event a webhook endpoint subscribes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum EndpointEvent {
    /// A job succeeded.
    #[value(name = "job.succeeded")]
    JobSucceeded,
    /// A job failed.
    #[value(name = "job.failed")]
    JobFailed,
    /// A job was cancelled.
    #[value(name = "job.cancelled")]
    JobCancelled,
    /// A running job's progress (at most one per job every 5 seconds, the latest).
    #[value(name = "job.progress")]
    JobProgress,
    /// A succeeded job's result is deleted in 24 hours.
    #[value(name = "job.result_expiring")]
    JobResultExpiring,
}

impl EndpointEvent {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointEvent::JobSucceeded => "job.succeeded",
            EndpointEvent::JobFailed => "job.failed",
            EndpointEvent::JobCancelled => "job.cancelled",
            EndpointEvent::JobProgress => "job.progress",
            EndpointEvent::JobResultExpiring => "job.result_expiring",
        }
    }
}

/// `endpoint create`.
#[derive(Debug, Args)]
pub struct EndpointCreate {
    /// Where the events are sent (https, a public host).
    #[arg(long)]
    pub url: String,
    /// The events it receives, comma-separated (or the option repeated).
    #[arg(long, value_enum, value_delimiter = ',', required = true)]
    pub events: Vec<EndpointEvent>,
    /// What it is for (at most 256 characters).
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
}

/// `endpoint update`: what changes (at least one of them); what is not named stays.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("change").required(true).multiple(true)))]
pub struct EndpointUpdate {
    /// The endpoint id.
    pub id: String,
    /// The new URL.
    #[arg(long, group = "change")]
    pub url: Option<String>,
    /// The new events, comma-separated (they replace the old ones).
    #[arg(long, value_enum, value_delimiter = ',', group = "change")]
    pub events: Option<Vec<EndpointEvent>>,
    /// The new description.
    #[arg(long, value_name = "TEXT", group = "change")]
    pub description: Option<String>,
    /// Remove the description.
    #[arg(long, conflicts_with = "description", group = "change")]
    pub no_description: bool,
}

/// A command naming one webhook endpoint.
#[derive(Debug, Args)]
pub struct EndpointRef {
    /// The endpoint id.
    pub id: String,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeliveryStatus {
    /// Queued, or being retried.
    Pending,
    /// The endpoint answered 2xx.
    Delivered,
    /// Every attempt failed (or the endpoint was disabled).
    Failed,
}

impl DeliveryStatus {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
        }
    }
}

/// `endpoint deliveries`.
#[derive(Debug, Args)]
pub struct EndpointDeliveries {
    /// The endpoint id.
    pub id: String,
    /// Only deliveries in this status.
    #[arg(long, value_enum)]
    pub status: Option<DeliveryStatus>,
    /// How many, and whether to follow every page.
    #[command(flatten)]
    pub pages: Pages,
}

/// `endpoint resend`.
#[derive(Debug, Args)]
pub struct DeliveryRef {
    /// The delivery's webhook id (`msg_…`, from `longhaul endpoint deliveries`).
    pub webhook_id: String,
}

/// `endpoint recover`.
#[derive(Debug, Args)]
pub struct EndpointRecover {
    /// The endpoint id.
    pub id: String,
    /// Failed deliveries first recorded at or after this time (RFC 3339) are queued again.
    #[arg(long, value_name = "TIME")]
    pub since: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The CLI keeps its own copies of the API's vocabularies (it depends on no server crate);
    /// each copy spells every value the API's does, in its order, and clap accepts it so.
    #[test]
    fn the_clis_vocabularies_are_the_apis() {
        fn spelled<T: ValueEnum>(as_str: impl Fn(&T) -> &'static str) -> Vec<&'static str> {
            T::value_variants()
                .iter()
                .map(|value| {
                    let name = value.to_possible_value().expect("a value").get_name().to_owned();
                    assert_eq!(name, as_str(value), "clap's name is the API's");
                    as_str(value)
                })
                .collect()
        }
        use longhaul_domain::{admission, endpoints};
        assert_eq!(
            spelled::<EndpointEvent>(|e| e.as_str()),
            endpoints::EndpointEvent::ALL.map(|e| e.as_str()),
        );
        assert_eq!(
            spelled::<Priority>(|p| p.as_str()),
            admission::Priority::ALL.map(|p| p.as_str()),
        );
    }

    #[test]
    fn usage_errors_are_exit_code_2() {
        let err = Cli::try_parse_from(["longhaul", "submit"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let err = Cli::try_parse_from(["longhaul", "submit", "demo", "--priority", "urgent"])
            .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let err =
            Cli::try_parse_from(["longhaul", "schedule", "create", "--type", "demo"]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "--schedule is required");
        let err = Cli::try_parse_from([
            "longhaul",
            "schedule",
            "create",
            "--type",
            "demo",
            "--schedule",
            "rate(1 hour)",
            "--overlap",
            "sometimes",
        ])
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn overlap_takes_the_apis_spelling_and_a_dashed_one() {
        for spelling in ["buffer_one", "buffer-one"] {
            let cli = Cli::try_parse_from([
                "longhaul",
                "schedule",
                "create",
                "--type",
                "demo",
                "--schedule",
                "rate(1 hour)",
                "--overlap",
                spelling,
            ])
            .unwrap();
            let Command::Schedule(ScheduleCommand::Create(args)) = cli.command else { panic!() };
            assert_eq!(args.overlap, Some(Overlap::BufferOne));
        }
    }
}
