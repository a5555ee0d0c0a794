//! Following a job to its end: the live event stream (`events_url`, server-sent events) when
//! the job offers one, else polling `GET /jobs/{id}` at the pace its `Retry-After` asks.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header;
use serde_json::Value;

use crate::api::Api;
use crate::error::CliError;
use crate::output::JobBar;
use crate::problem::Problem;

/// Poll interval when the answer names none.
const DEFAULT_POLL: Duration = Duration::from_secs(2);
/// The longest wait between polls, whatever `Retry-After` says.
const MAX_POLL: Duration = Duration::from_secs(30);
/// Failed reads of the job in a row (unreachable API, 429, 5xx) before the watch gives up.
const MAX_TRANSIENT_FAILURES: u32 = 5;
/// Streams in a row that end without one event before the stream is given up for polling.
const MAX_EMPTY_STREAMS: u32 = 3;

/// How one stream connection ended.
#[derive(Debug)]
enum StreamEnd {
    /// The `status` event came: the job is terminal.
    Terminal,
    /// The stream closed (its time limit) after `events` events: reconnect with a fresh link.
    Closed { events: u32 },
}

/// Follows job `job_id` until it is terminal, drawing `bar`; returns the job's final
/// document (`GET /jobs/{id}`).
pub async fn watch(api: &Api, job_id: &str, bar: &JobBar) -> Result<Value, CliError> {
    let path = format!("/jobs/{job_id}");
    let mut last_event_id: Option<String> = None;
    let mut use_stream = true;
    let mut empty_streams = 0;
    loop {
        let reply = get_patiently(api, &path, bar).await?;
        let poll = reply.retry_after().unwrap_or(DEFAULT_POLL);
        let job = reply.body;
        let status = job.get("status").and_then(Value::as_str).unwrap_or("unknown").to_owned();
        bar.update(&status, job.get("progress").unwrap_or(&Value::Null));
        if crate::error::Exit::for_status(&status).is_some() {
            bar.finish(&status);
            return Ok(job);
        }
        let events_url = job.get("events_url").and_then(Value::as_str).filter(|_| use_stream);
        if let Some(url) = events_url {
            let resume = last_event_id.as_deref().unwrap_or("the start");
            bar.debug(&format!("live stream: connecting (from {resume})"));
            match stream(api, url, &mut last_event_id, bar).await {
                Ok(StreamEnd::Terminal) => bar.debug("live stream: the job ended"),
                Ok(StreamEnd::Closed { events }) => {
                    bar.debug(&format!("live stream: closed after {events} events; reconnecting"));
                    empty_streams = if events == 0 { empty_streams + 1 } else { 0 };
                    if empty_streams >= MAX_EMPTY_STREAMS {
                        bar.println("the live stream keeps closing; polling instead");
                        use_stream = false;
                    }
                }
                Err(err) => {
                    bar.println(&format!("live stream unavailable ({err}); polling instead"));
                    use_stream = false;
                }
            }
        } else {
            let poll = poll.clamp(Duration::from_secs(1), MAX_POLL);
            bar.debug(&format!("polling: next in {}s", poll.as_secs()));
            tokio::time::sleep(poll).await;
        }
    }
}

/// `GET path`, tried again (up to [`MAX_TRANSIENT_FAILURES`] times in a row, a poll interval
/// apart) when the API could not be reached or answered 429/5xx: a network blip must not end a
/// watch of an hours-long job. Any other error ends it at once.
async fn get_patiently(api: &Api, path: &str, bar: &JobBar) -> Result<crate::api::Reply, CliError> {
    let mut failures = 0;
    loop {
        let err = match api.get(path).await {
            Ok(reply) => return Ok(reply),
            Err(err) => err,
        };
        let transient = match &err {
            CliError::Transport { .. } => true,
            CliError::Api(problem) => problem.status() == 429 || problem.status() >= 500,
            _ => false,
        };
        failures += 1;
        if !transient || failures > MAX_TRANSIENT_FAILURES {
            return Err(err);
        }
        bar.println(&format!("{err}; trying again in {}s", DEFAULT_POLL.as_secs()));
        tokio::time::sleep(DEFAULT_POLL).await;
    }
}

/// Reads one connection of the job's event stream, resuming after `last_event_id`.
async fn stream(
    api: &Api,
    url: &str,
    last_event_id: &mut Option<String>,
    bar: &JobBar,
) -> Result<StreamEnd, CliError> {
    // The link carries its own token: the API's bearer token is never sent there.
    let mut request = api.http().get(url).header(header::ACCEPT, "text/event-stream");
    if let Some(id) = last_event_id.as_deref() {
        request = request.header("last-event-id", id);
    }
    let what = "opening the live stream";
    let response = request.send().await.map_err(CliError::transport(what))?;
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if !status.is_success() {
        let body = response.bytes().await.map_err(CliError::transport(what))?;
        let problem = Problem::from_answer(status.as_u16(), content_type.as_deref(), &body);
        return Err(CliError::Api(Box::new(problem)));
    }
    if !content_type.is_some_and(|c| c.starts_with("text/event-stream")) {
        return Err(CliError::Protocol("the live stream is not text/event-stream".into()));
    }
    let mut events = response.bytes_stream().eventsource();
    let mut count = 0;
    while let Some(event) = events.next().await {
        let event =
            event.map_err(|e| CliError::Protocol(format!("reading the live stream: {e}")))?;
        let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
        match event.event.as_str() {
            "progress" => {
                count += 1;
                if !event.id.is_empty() {
                    *last_event_id = Some(event.id);
                }
                let status = data.get("status").and_then(Value::as_str).unwrap_or("running");
                bar.update(status, &data);
            }
            "status" => return Ok(StreamEnd::Terminal),
            "error" => {
                let detail = data.get("detail").and_then(Value::as_str).unwrap_or("stream error");
                return Err(CliError::Protocol(detail.to_owned()));
            }
            // `retry:` blocks, keep-alive comments and unknown events carry nothing to show.
            _ => {}
        }
    }
    Ok(StreamEnd::Closed { events: count })
}
