//! What the user sees: JSON documents or text on stdout, errors and progress bars on stderr
//! (bars only when stderr is a terminal).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{HumanDuration, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use crate::error::CliError;

/// Where and how results are printed.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// `--json`: one JSON document on stdout.
    pub json: bool,
    /// `--verbose`: say how a job is followed.
    pub verbose: bool,
    bars: bool,
}

impl Output {
    /// Text or JSON output; bars are drawn only on a terminal.
    pub fn new(json: bool, verbose: bool) -> Output {
        Output { json, verbose, bars: std::io::stderr().is_terminal() }
    }

    /// Prints the command's JSON document (with `--json`), or `text` (without).
    pub fn print(&self, document: &Value, text: impl FnOnce() -> String) {
        if self.json {
            println!("{}", serde_json::to_string_pretty(document).unwrap_or_default());
        } else {
            let text = text();
            if !text.is_empty() {
                println!("{}", text.trim_end_matches('\n'));
            }
        }
    }

    /// A remark for the person at the terminal (stderr; never part of the output).
    pub fn note(&self, message: &str) {
        eprintln!("{message}");
    }

    /// Reports a failure: a line (and a hint) on stderr, and with `--json` an
    /// `{"error": …}` document on stdout.
    pub fn error(&self, err: &CliError) {
        eprintln!("error: {err}");
        if let CliError::Api(problem) = err
            && let Some(hint) = problem.hint()
        {
            eprintln!("hint: {hint}");
        }
        if self.json {
            let error = match err {
                CliError::Api(problem) => problem.to_json(),
                other => json!({ "title": other.to_string() }),
            };
            println!("{}", json!({ "error": error }));
        }
    }

    /// A bar for a transfer of `total` bytes (hidden when stderr is not a terminal).
    pub fn byte_bar(&self, total: u64, label: &str) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(Some(total), self.target());
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(label.to_owned());
        bar
    }

    /// A bar for a job's progress (hidden when stderr is not a terminal).
    pub fn job_bar(&self, job_id: &str) -> JobBar {
        let bar = ProgressBar::with_draw_target(Some(100), self.target());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {prefix} [{bar:30.green/white}] {pos:>3}% {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(short_id(job_id).to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        JobBar { bar, verbose: self.verbose }
    }

    fn target(&self) -> ProgressDrawTarget {
        if self.bars { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() }
    }
}

/// A job's live progress bar: percent, stage, items and ETA.
pub struct JobBar {
    bar: ProgressBar,
    verbose: bool,
}

impl JobBar {
    /// Shows `progress` (a job's `progress` object, or a `progress` event's data) and `status`.
    pub fn update(&self, status: &str, progress: &Value) {
        if let Some(pct) = progress.get("pct").and_then(Value::as_f64) {
            // Progress never goes backwards on the server; the bar never does either.
            let pct = pct.clamp(0.0, 100.0).floor() as u64;
            if pct > self.bar.position() {
                self.bar.set_position(pct);
            }
        }
        self.bar.set_message(describe_progress(status, progress));
    }

    /// Prints a line above the bar.
    pub fn println(&self, line: &str) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// Prints a line above the bar with `--verbose` only.
    pub fn debug(&self, line: &str) {
        if self.verbose {
            self.println(line);
        }
    }

    /// Ends the bar on the job's terminal `status` (a succeeded job's bar shows 100%).
    pub fn finish(&self, status: &str) {
        if matches!(status, "succeeded" | "expired") {
            self.bar.set_position(100);
        }
        self.bar.finish_with_message(status.to_owned());
    }
}

/// `status · stage 1/2 process · 12/50 items · ETA 4s`.
pub fn describe_progress(status: &str, progress: &Value) -> String {
    let mut parts = vec![status.to_owned()];
    if let Some(stage) = progress.get("stage").and_then(Value::as_str) {
        let index = progress.get("stage_index").and_then(Value::as_u64);
        let total = progress.get("stages_total").and_then(Value::as_u64);
        parts.push(match (index, total) {
            // `stage_index` is 1-based.
            (Some(i), Some(n)) => format!("stage {i}/{n} {stage}"),
            _ => format!("stage {stage}"),
        });
    }
    if let Some(done) = progress.get("items_done").and_then(Value::as_u64) {
        parts.push(match progress.get("items_total").and_then(Value::as_u64) {
            Some(total) => format!("{done}/{total} items"),
            None => format!("{done} items"),
        });
    }
    if let Some(shards) = progress.get("shards").filter(|s| !s.is_null()) {
        parts.push(describe_shards(shards));
    }
    if let Some(eta) = progress.get("eta").and_then(Value::as_u64) {
        parts.push(format!("ETA {}", HumanDuration(Duration::from_secs(eta))));
    }
    parts.join(" · ")
}

/// `shards 3/8 done, 2 running, 1 failed, 1 retried`: the counts that are not zero.
fn describe_shards(shards: &Value) -> String {
    let count = |name: &str| shards.get(name).and_then(Value::as_u64).unwrap_or(0);
    let total = count("total");
    let mut text = format!("shards {}/{total} done", count("succeeded"));
    for (name, label) in [("running", "running"), ("failed", "failed")] {
        if count(name) > 0 {
            text.push_str(&format!(", {} {label}", count(name)));
        }
    }
    // Every start beyond each shard's first is a retry.
    let retried = count("attempts").saturating_sub(total);
    if retried > 0 {
        text.push_str(&format!(", {retried} retried"));
    }
    text
}

/// The first block of a job id (enough to tell jobs apart at a glance).
pub fn short_id(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// A field of `value` as text (`-` when absent or null).
pub fn field(value: &Value, name: &str) -> String {
    match value.get(name) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> =
            cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(header.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_as_a_sentence() {
        let progress = json!({"pct": 24.0, "stage": "process", "stage_index": 1,
            "stages_total": 1, "items_done": 12, "items_total": 50, "eta": 95});
        assert_eq!(
            describe_progress("running", &progress),
            "running · stage 1/1 process · 12/50 items · ETA 2 minutes"
        );
        assert_eq!(describe_progress("queued", &json!({"pct": 0, "eta": null})), "queued");
        let fanned = json!({"pct": 40.0, "items_done": 40, "items_total": 100, "eta": null,
            "shards": {"total": 8, "pending": 2, "running": 2, "succeeded": 3, "failed": 1,
                "attempts": 7}});
        assert_eq!(
            describe_progress("running", &fanned),
            "running · 40/100 items · shards 3/8 done, 2 running, 1 failed"
        );
        let retried = json!({"shards": {"total": 2, "pending": 0, "running": 0,
            "succeeded": 2, "failed": 0, "attempts": 5}});
        assert_eq!(
            describe_progress("succeeded", &retried),
            "succeeded · shards 2/2 done, 3 retried"
        );
        assert_eq!(describe_progress("queued", &json!({"shards": null})), "queued");
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![vec!["a".into(), "long value".into()], vec!["bbb".into(), "x".into()]];
        assert_eq!(table(&["ID", "V"], &rows), "ID   V\na    long value\nbbb  x");
    }
}
