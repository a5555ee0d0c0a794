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
    /// Only jobs in this status (pending, queued, running, succeeded, failed, cancelled, expired).
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

/// `cancel`.
#[derive(Debug, Args)]
pub struct Cancel {
    /// The job id.
    pub id: String,
    /// Why (recorded on the job).
    #[arg(long)]
    pub reason: Option<String>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
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
