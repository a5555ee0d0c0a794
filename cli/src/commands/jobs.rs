//! The commands that read or act on jobs: `status`, `ls`, `cancel`, `retry`, `deliveries`,
//! `job-types`.

use serde_json::{Value, json};

use crate::api::Api;
use crate::cli::{Cancel, List, SignalArgs};
use crate::error::{CliError, Exit};
use crate::output::{Output, describe_progress, field, table};

/// `status`: the job's document (JSON) or a summary of it (text).
pub async fn status(api: &Api, out: &Output, job_id: &str) -> Result<Exit, CliError> {
    let job = api.get(&format!("/jobs/{job_id}")).await?.body;
    out.print(&job, || describe_job(&job));
    Ok(Exit::Ok)
}

/// A job as a few `name: value` lines.
pub fn describe_job(job: &Value) -> String {
    let status = field(job, "status");
    let mut lines = vec![
        format!("job:       {}", field(job, "job_id")),
        format!("type:      {}", field(job, "type")),
        format!("status:    {status}"),
    ];
    if let Some(progress) = job.get("progress").filter(|p| p.is_object()) {
        let pct = progress.get("pct").and_then(Value::as_f64).unwrap_or(0.0);
        lines.push(format!("progress:  {pct:.0}% ({})", describe_progress(&status, progress)));
    }
    for name in ["priority", "attempt", "created_at", "started_at", "finished_at", "retry_of"] {
        if job.get(name).is_some_and(|v| !v.is_null()) {
            lines.push(format!("{:<10} {}", format!("{name}:"), field(job, name)));
        }
    }
    if let Some(waiting) = job.get("waiting").and_then(|w| w.get("message")).and_then(Value::as_str)
    {
        lines.push(format!("waiting:   {waiting}"));
    }
    if job.get("schedule_id").is_some_and(|v| !v.is_null()) {
        // Submitted by a schedule's tick.
        lines.push(format!(
            "schedule:  {} (tick {})",
            field(job, "schedule_id"),
            field(job, "scheduled_at")
        ));
    }
    if job.get("retry_at").is_some_and(|v| !v.is_null()) {
        // Its last attempt failed transiently: the next one starts then.
        lines.push(format!("retry at:  {}", field(job, "retry_at")));
    }
    if let Some(last) = job.get("last_error").filter(|e| e.is_object()) {
        lines.push(format!("last error: {}: {}", field(last, "code"), field(last, "message")));
    }
    if let Some(error) = job.get("error").filter(|e| e.is_object()) {
        lines.push(format!("error:     {}: {}", field(error, "code"), field(error, "message")));
    }
    if let Some(cancellation) = job.get("cancellation").filter(|c| c.is_object()) {
        lines.push(format!("cancelled: {}", field(cancellation, "reason")));
    }
    if let Some(compensation) = job.get("compensation").filter(|c| c.is_object()) {
        // The undos of the stages it started, run before it ends.
        lines.push(format!(
            "undo:      {}, then {}",
            field(compensation, "status"),
            field(compensation, "ends_as")
        ));
        for step in compensation.get("stages").and_then(Value::as_array).into_iter().flatten() {
            let error = step.get("error").and_then(Value::as_str).map(|e| format!(" ({e})"));
            lines.push(format!(
                "  {}: {}{}",
                field(step, "stage"),
                field(step, "status"),
                error.unwrap_or_default()
            ));
        }
    }
    if job.get("result_url").is_some_and(|v| !v.is_null()) {
        lines.push(format!("result:    longhaul result {} -o FILE", field(job, "job_id")));
    }
    lines.join("\n")
}

/// The `GET /jobs` query for one page of `args` (`page` jobs, after `cursor`).
pub fn list_query(args: &List, page: u32, cursor: Option<&str>) -> Vec<(&'static str, String)> {
    let mut query = vec![("limit", page.to_string())];
    if let Some(status) = &args.status {
        query.push(("status", status.clone()));
    }
    if let Some(kind) = &args.kind {
        query.push(("type", kind.clone()));
    }
    if let Some(schedule) = &args.schedule {
        query.push(("schedule_id", schedule.clone()));
    }
    if let Some(cursor) = cursor {
        query.push(("cursor", cursor.to_owned()));
    }
    query
}

/// `ls`: follows `next_cursor` until `--limit` jobs (or every job with `--all`).
pub async fn list(api: &Api, out: &Output, args: &List) -> Result<Exit, CliError> {
    let limit = (!args.all).then_some(args.limit);
    let (jobs, cursor) =
        super::pages(api, "/jobs", "jobs", limit, |page, cursor| list_query(args, page, cursor))
            .await?;
    let document = json!({ "jobs": jobs, "next_cursor": cursor });
    out.print(&document, || {
        let rows: Vec<Vec<String>> = jobs
            .iter()
            .map(|j| {
                ["job_id", "type", "status", "created_at", "finished_at"]
                    .map(|name| field(j, name))
                    .to_vec()
            })
            .collect();
        let mut text = table(&["ID", "TYPE", "STATUS", "CREATED", "FINISHED"], &rows);
        if cursor.is_some() {
            text.push_str("\n(more: raise --limit or use --all)");
        }
        text
    });
    Ok(Exit::Ok)
}

/// `cancel`: asks for the job's cancellation (a running job stops at its next progress write).
pub async fn cancel(api: &Api, out: &Output, args: &Cancel) -> Result<Exit, CliError> {
    let mut body = json!({});
    if let Some(reason) = &args.reason {
        body["reason"] = reason.clone().into();
    }
    let reply = api.post(&format!("/jobs/{}/cancel", args.id), &body).await?.body;
    out.print(&reply, || {
        let status = field(&reply, "status");
        if status == "cancelled" {
            format!("job {} cancelled", args.id)
        } else {
            format!("job {} cancellation requested (status now {status})", args.id)
        }
    });
    Ok(Exit::Ok)
}

/// `pause`: pauses the job (a running one at its next progress write, after its checkpoint).
pub async fn pause(api: &Api, out: &Output, args: &Cancel) -> Result<Exit, CliError> {
    let mut body = json!({});
    if let Some(reason) = &args.reason {
        body["reason"] = reason.clone().into();
    }
    let reply = api.post(&format!("/jobs/{}/pause", args.id), &body).await?.body;
    out.print(&reply, || {
        let status = field(&reply, "status");
        if status == "paused" {
            format!("job {} paused", args.id)
        } else {
            format!("job {} pause requested (status now {status})", args.id)
        }
    });
    Ok(Exit::Ok)
}

/// `resume`: the paused job is dispatched again and continues from its checkpoint.
pub async fn resume(api: &Api, out: &Output, job_id: &str) -> Result<Exit, CliError> {
    let reply = api.post(&format!("/jobs/{job_id}/resume"), &json!({})).await?.body;
    out.print(&reply, || match field(&reply, "status").as_str() {
        "running" => format!("job {job_id} was not paused yet: its pause is withdrawn"),
        status => format!("job {job_id} resumed (status now {status})"),
    });
    Ok(Exit::Ok)
}

/// `signal`: sends the job signal `name` (with `--payload`, any JSON inline or `@file`).
pub async fn signal(api: &Api, out: &Output, args: &SignalArgs) -> Result<Exit, CliError> {
    let mut body = json!({});
    if let Some(payload) = &args.payload {
        let text = match payload.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("--payload @{path}: {e}")))?,
            None => payload.clone(),
        };
        body["payload"] = serde_json::from_str(&text)
            .map_err(|e| CliError::Usage(format!("--payload: not valid JSON: {e}")))?;
    }
    let path = format!("/jobs/{}/signals/{}", args.id, args.name);
    let reply = api.post(&path, &body).await?.body;
    out.print(&reply, || match field(&reply, "status").as_str() {
        "pending" => format!("signal {} sent: job {} resumes", args.name, args.id),
        status => format!("signal {} kept for job {} (status {status})", args.name, args.id),
    });
    Ok(Exit::Ok)
}

/// `retry`: the failed or cancelled job runs again as a new job; prints the new job's id.
pub async fn retry(api: &Api, out: &Output, job_id: &str) -> Result<Exit, CliError> {
    let reply = api.post(&format!("/jobs/{job_id}/retry"), &json!({})).await?.body;
    out.print(&reply, || field(&reply, "job_id"));
    Ok(Exit::Ok)
}

/// `deliveries`: the job's webhook delivery attempts.
pub async fn deliveries(api: &Api, out: &Output, job_id: &str) -> Result<Exit, CliError> {
    let reply = api.get(&format!("/jobs/{job_id}/deliveries")).await?.body;
    out.print(&reply, || {
        let attempts = reply.get("deliveries").and_then(Value::as_array);
        let rows: Vec<Vec<String>> = attempts
            .into_iter()
            .flatten()
            .map(|d| {
                let mut row: Vec<String> = ["at", "event", "attempt", "status_code", "outcome"]
                    .map(|name| field(d, name))
                    .to_vec();
                row.push(format!("{}ms", field(d, "latency_ms")));
                row.push(field(d, "error"));
                row
            })
            .collect();
        if rows.is_empty() {
            return format!("job {job_id}: no webhook deliveries");
        }
        table(&["AT", "EVENT", "ATTEMPT", "HTTP", "OUTCOME", "LATENCY", "ERROR"], &rows)
    });
    Ok(Exit::Ok)
}

/// `job-types`: the types this deployment accepts, their stages and policy.
pub async fn job_types(api: &Api, out: &Output) -> Result<Exit, CliError> {
    let reply = api.get("/job-types").await?.body;
    out.print(&reply, || {
        let types = reply.get("job_types").and_then(Value::as_array);
        let rows: Vec<Vec<String>> = types
            .into_iter()
            .flatten()
            .map(|t| {
                let stages: Vec<&str> = t
                    .get("stages")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let policy = t.get("policy").unwrap_or(&Value::Null);
                vec![
                    field(t, "type"),
                    stages.join(" → "),
                    field(policy, "max_attempts"),
                    field(policy, "max_runtime_seconds"),
                ]
            })
            .collect();
        table(&["TYPE", "STAGES", "MAX ATTEMPTS", "MAX RUNTIME (s)"], &rows)
    });
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    #[test]
    fn list_queries_carry_the_filters_and_cursor() {
        let cli = Cli::try_parse_from([
            "longhaul",
            "ls",
            "--status",
            "failed",
            "--type",
            "demo",
            "--schedule",
            "s1",
        ])
        .unwrap();
        let Command::Ls(args) = cli.command else { panic!() };
        assert_eq!(args.limit, 20);
        let query = list_query(&args, 20, Some("c1"));
        assert_eq!(
            query,
            vec![
                ("limit", "20".to_owned()),
                ("status", "failed".to_owned()),
                ("type", "demo".to_owned()),
                ("schedule_id", "s1".to_owned()),
                ("cursor", "c1".to_owned())
            ]
        );
    }

    #[test]
    fn a_job_reads_as_lines() {
        let job = json!({"job_id": "j1", "type": "demo", "status": "failed", "attempt": 1,
            "error": {"code": "Job.Fatal", "message": "boom"}, "progress": {"pct": 40.0}});
        let text = describe_job(&job);
        assert!(text.contains("status:    failed"), "{text}");
        assert!(text.contains("error:     Job.Fatal: boom"), "{text}");
        assert!(text.contains("progress:  40%"), "{text}");
    }

    #[test]
    fn a_compensated_job_lists_its_undos() {
        let job = json!({"job_id": "j1", "type": "demo", "status": "failed",
            "compensation": {"status": "failed", "ends_as": "failed", "stages": [
                {"stage": "ship", "status": "failed", "error": "refused"},
                {"stage": "charge", "status": "done"}]}});
        let text = describe_job(&job);
        assert!(text.contains("undo:      failed, then failed"), "{text}");
        assert!(text.contains("  ship: failed (refused)"), "{text}");
        assert!(text.contains("  charge: done"), "{text}");
    }

    #[test]
    fn a_scheduled_job_names_its_schedule_and_tick() {
        let job = json!({"job_id": "j1", "type": "demo", "status": "queued",
            "schedule_id": "s1", "scheduled_at": "2026-11-24T02:00:00.000Z"});
        let text = describe_job(&job);
        assert!(text.contains("schedule:  s1 (tick 2026-11-24T02:00:00.000Z)"), "{text}");
    }

    #[test]
    fn a_job_waiting_for_its_next_attempt_says_when_and_why() {
        let job = json!({"job_id": "j1", "type": "demo", "status": "queued", "attempt": 1,
            "retry_at": "2026-11-24T14:00:00.000Z",
            "last_error": {"code": "Job.Retryable", "message": "throttled"}});
        let text = describe_job(&job);
        assert!(text.contains("retry at:  2026-11-24T14:00:00.000Z"), "{text}");
        assert!(text.contains("last error: Job.Retryable: throttled"), "{text}");
    }
}
