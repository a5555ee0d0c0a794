//! One module per group of commands; [`dispatch`] runs the parsed one.

mod endpoints;
mod jobs;
mod result;
mod schedules;
mod submit;
mod upload;

use serde_json::Value;

use crate::api::Api;
use crate::cli::{Cli, Command};
use crate::error::{CliError, Exit};
use crate::output::{JobBar, Output};

/// Runs `cli`'s command; its exit code when it completed.
pub async fn dispatch(cli: &Cli, out: &Output) -> Result<Exit, CliError> {
    let api = Api::new(&cli.global.api, cli.global.token.as_deref())?;
    match &cli.command {
        Command::Submit(args) => submit::submit(&api, out, args).await,
        Command::Upload(args) => upload::upload(&api, out, args).await,
        Command::Status(job) => jobs::status(&api, out, &job.id).await,
        Command::Watch(job) => watch(&api, out, &job.id).await,
        Command::Ls(args) => jobs::list(&api, out, args).await,
        Command::Cancel(args) => jobs::cancel(&api, out, args).await,
        Command::Pause(args) => jobs::pause(&api, out, args).await,
        Command::Resume(job) => jobs::resume(&api, out, &job.id).await,
        Command::Signal(args) => jobs::signal(&api, out, args).await,
        Command::Retry(job) => jobs::retry(&api, out, &job.id).await,
        Command::Result(args) => result::result(&api, out, args).await,
        Command::Deliveries(job) => jobs::deliveries(&api, out, &job.id).await,
        Command::JobTypes => jobs::job_types(&api, out).await,
        Command::Schedule(command) => schedules::dispatch(&api, out, command).await,
        Command::Endpoint(command) => endpoints::dispatch(&api, out, command).await,
    }
}

/// Largest page a listing (`GET /jobs`, `GET /schedules`, an endpoint's deliveries) serves.
const MAX_PAGE: u32 = 100;

/// Follows a listing's `next_cursor` from its first page: the `key` array of every page until
/// there are `limit` items (`None`: to the last page). `query(page, cursor)` is one page's
/// query. Returns the items and the cursor of what is left (`None`: nothing).
async fn pages<'a>(
    api: &Api,
    path: &str,
    key: &str,
    limit: Option<u32>,
    query: impl Fn(u32, Option<&str>) -> Vec<(&'a str, String)>,
) -> Result<(Vec<Value>, Option<String>), CliError> {
    let mut items: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let what = format!("GET {path}");
    loop {
        let wanted = limit.map_or(MAX_PAGE, |limit| limit.saturating_sub(items.len() as u32));
        let request = api
            .request(reqwest::Method::GET, path)
            .query(&query(wanted.min(MAX_PAGE), cursor.as_deref()));
        let page = api.send(request, &what).await?.body;
        items.extend(page.get(key).and_then(Value::as_array).cloned().unwrap_or_default());
        cursor = page.get("next_cursor").and_then(Value::as_str).map(str::to_owned);
        let full = limit.is_some_and(|limit| items.len() as u32 >= limit);
        if cursor.is_none() || full {
            return Ok((items, cursor));
        }
    }
}

/// `watch`: follows the job with a bar, then prints its end; the exit code is the job's.
pub async fn watch(api: &Api, out: &Output, job_id: &str) -> Result<Exit, CliError> {
    let bar: JobBar = out.job_bar(job_id);
    let job = crate::watch::watch(api, job_id, &bar).await?;
    let status = job.get("status").and_then(Value::as_str).unwrap_or("unknown").to_owned();
    out.print(&job, || final_line(job_id, &job));
    Exit::for_status(&status)
        .ok_or_else(|| CliError::Protocol(format!("job {job_id} ended in unknown status {status}")))
}

/// `job <id> succeeded` / `job <id> failed: <code>: <message>` / `job <id> cancelled (reason)`.
pub fn final_line(job_id: &str, job: &Value) -> String {
    let status = job.get("status").and_then(Value::as_str).unwrap_or("unknown");
    let mut line = format!("job {job_id} {status}");
    if let Some(error) = job.get("error").filter(|e| e.is_object()) {
        let code = error.get("code").and_then(Value::as_str).unwrap_or("error");
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        line.push_str(&format!(": {code}: {message}"));
    }
    if let Some(reason) = job.pointer("/cancellation/reason").and_then(Value::as_str) {
        line.push_str(&format!(" ({reason})"));
    }
    line
}
