//! `endpoint create|ls|get|update|rm|enable|deliveries|resend|recover`: webhook endpoints
//! (`/webhooks/endpoints`) and their deliveries.

use serde_json::{Value, json};

use crate::api::Api;
use crate::cli::{
    DeliveryRef, EndpointCommand, EndpointCreate, EndpointDeliveries, EndpointEvent,
    EndpointRecover, EndpointUpdate,
};
use crate::error::{CliError, Exit};
use crate::output::{Output, field, table};

/// Where the endpoints are.
const ENDPOINTS: &str = "/webhooks/endpoints";

/// Runs one `endpoint` subcommand.
pub async fn dispatch(
    api: &Api,
    out: &Output,
    command: &EndpointCommand,
) -> Result<Exit, CliError> {
    match command {
        EndpointCommand::Create(args) => create(api, out, args).await,
        EndpointCommand::Ls => list(api, out).await,
        EndpointCommand::Get(endpoint) => get(api, out, &endpoint.id).await,
        EndpointCommand::Update(args) => update(api, out, args).await,
        EndpointCommand::Rm(endpoint) => remove(api, out, &endpoint.id).await,
        EndpointCommand::Enable(endpoint) => enable(api, out, &endpoint.id).await,
        EndpointCommand::Deliveries(args) => deliveries(api, out, args).await,
        EndpointCommand::Resend(delivery) => resend(api, out, delivery).await,
        EndpointCommand::Recover(args) => recover(api, out, args).await,
    }
}

fn endpoint_path(id: &str) -> String {
    format!("{ENDPOINTS}/{id}")
}

/// The events as the API names them, in the order given, each once.
fn event_names(events: &[EndpointEvent]) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for event in events {
        if !names.contains(&event.as_str()) {
            names.push(event.as_str());
        }
    }
    names
}

/// The `POST /webhooks/endpoints` body for `args`.
pub fn create_body(args: &EndpointCreate) -> Value {
    let mut body = json!({ "url": args.url, "events": event_names(&args.events) });
    if let Some(description) = &args.description {
        body["description"] = description.clone().into();
    }
    body
}

/// The `PATCH /webhooks/endpoints/{id}` body for `args`: only what changes
/// (`"description": null` removes the description).
pub fn update_body(args: &EndpointUpdate) -> Value {
    let mut body = json!({});
    if let Some(url) = &args.url {
        body["url"] = url.clone().into();
    }
    if let Some(events) = &args.events {
        body["events"] = json!(event_names(events));
    }
    if let Some(description) = &args.description {
        body["description"] = description.clone().into();
    } else if args.no_description {
        body["description"] = Value::Null;
    }
    body
}

/// An endpoint's events as one comma-separated list.
fn events_text(endpoint: &Value) -> String {
    let names: Vec<&str> = endpoint
        .get("events")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if names.is_empty() { "-".into() } else { names.join(",") }
}

/// Why an endpoint is not simply healthy: `disabled (gone) at …`, `failing since …`, or `-`.
pub fn health(endpoint: &Value) -> String {
    if field(endpoint, "status") == "disabled" {
        return format!(
            "disabled ({}) at {}",
            field(endpoint, "disabled_reason"),
            field(endpoint, "disabled_at")
        );
    }
    match endpoint.get("failing_since").and_then(Value::as_str) {
        Some(since) => format!("failing since {since}"),
        None => "-".into(),
    }
}

/// One endpoint as a row of `endpoint ls`.
pub fn list_row(endpoint: &Value) -> Vec<String> {
    vec![
        field(endpoint, "endpoint_id"),
        field(endpoint, "status"),
        field(endpoint, "url"),
        events_text(endpoint),
        health(endpoint),
    ]
}

/// `endpoint create`: prints the new endpoint's id (text, with what it receives on stderr) or
/// the endpoint (JSON).
async fn create(api: &Api, out: &Output, args: &EndpointCreate) -> Result<Exit, CliError> {
    let endpoint = api.post(ENDPOINTS, &create_body(args)).await?.body;
    let id = endpoint
        .get("endpoint_id")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            CliError::Protocol(format!("POST {ENDPOINTS} answered without an endpoint_id"))
        })?
        .to_owned();
    if !out.json {
        out.note(&format!(
            "endpoint {id} created: {} → {}",
            events_text(&endpoint),
            field(&endpoint, "url")
        ));
    }
    out.print(&endpoint, || id.clone());
    Ok(Exit::Ok)
}

/// `endpoint ls`: every endpoint of the caller (the API answers them in one page).
async fn list(api: &Api, out: &Output) -> Result<Exit, CliError> {
    let reply = api.get(ENDPOINTS).await?.body;
    let endpoints = reply.get("endpoints").and_then(Value::as_array).cloned().unwrap_or_default();
    out.print(&reply, || {
        if endpoints.is_empty() {
            return "no webhook endpoints".into();
        }
        let rows: Vec<Vec<String>> = endpoints.iter().map(list_row).collect();
        table(&["ID", "STATUS", "URL", "EVENTS", "HEALTH"], &rows)
    });
    Ok(Exit::Ok)
}

/// `endpoint get`: the endpoint's JSON document (with or without `--json`).
async fn get(api: &Api, out: &Output, id: &str) -> Result<Exit, CliError> {
    let endpoint = api.get(&endpoint_path(id)).await?.body;
    out.print(&endpoint, || serde_json::to_string_pretty(&endpoint).unwrap_or_default());
    Ok(Exit::Ok)
}

/// `endpoint update`: prints `endpoint <id> updated: <events> → <url>` or the endpoint.
async fn update(api: &Api, out: &Output, args: &EndpointUpdate) -> Result<Exit, CliError> {
    let endpoint = api.patch(&endpoint_path(&args.id), &update_body(args)).await?.body;
    out.print(&endpoint, || {
        format!(
            "endpoint {} updated: {} → {}",
            args.id,
            events_text(&endpoint),
            field(&endpoint, "url")
        )
    });
    Ok(Exit::Ok)
}

/// `endpoint rm`: deletes the endpoint.
async fn remove(api: &Api, out: &Output, id: &str) -> Result<Exit, CliError> {
    api.delete(&endpoint_path(id)).await?;
    out.print(&json!({ "endpoint_id": id, "deleted": true }), || format!("endpoint {id} deleted"));
    Ok(Exit::Ok)
}

/// `endpoint enable`: prints `endpoint <id> enabled` (or the endpoint) and, for an endpoint
/// that was disabled, how to send what failed meanwhile.
async fn enable(api: &Api, out: &Output, id: &str) -> Result<Exit, CliError> {
    let before = api.get(&endpoint_path(id)).await?.body;
    let endpoint = api.post_empty(&format!("{}/enable", endpoint_path(id))).await?.body;
    let was_disabled = field(&before, "status") == "disabled";
    if was_disabled && !out.json {
        // A recovery picks deliveries by when they were first queued, which is before the
        // failure that disabled the endpoint: no time known here is the right `--since`.
        out.note(&format!(
            "it was {}; its failed deliveries: longhaul endpoint deliveries {id} --status \
             failed; to send them again: longhaul endpoint recover {id} --since TIME",
            health(&before)
        ));
    }
    out.print(&endpoint, || {
        if was_disabled {
            format!("endpoint {id} enabled")
        } else {
            format!("endpoint {id} is enabled (it was already)")
        }
    });
    Ok(Exit::Ok)
}

/// The `GET /webhooks/endpoints/{id}/deliveries` query for one page of `args`.
pub fn deliveries_query(
    args: &EndpointDeliveries,
    page: u32,
    cursor: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut query = vec![("limit", page.to_string())];
    if let Some(status) = args.status {
        query.push(("status", status.as_str().to_owned()));
    }
    if let Some(cursor) = cursor {
        query.push(("cursor", cursor.to_owned()));
    }
    query
}

/// One delivery as a row of `endpoint deliveries`.
pub fn delivery_row(delivery: &Value) -> Vec<String> {
    ["webhook_id", "job_id", "event", "status", "attempts", "last_attempt_at", "status_code"]
        .map(|name| field(delivery, name))
        .into_iter()
        .chain([field(delivery, "error")])
        .collect()
}

/// `endpoint deliveries`: follows `next_cursor` until `--limit` deliveries (or all with
/// `--all`).
async fn deliveries(api: &Api, out: &Output, args: &EndpointDeliveries) -> Result<Exit, CliError> {
    let limit = (!args.pages.all).then_some(args.pages.limit);
    let path = format!("{}/deliveries", endpoint_path(&args.id));
    let (deliveries, cursor) = super::pages(api, &path, "deliveries", limit, |page, cursor| {
        deliveries_query(args, page, cursor)
    })
    .await?;
    let document = json!({ "deliveries": deliveries, "next_cursor": cursor });
    out.print(&document, || {
        if deliveries.is_empty() {
            let which = args.status.map(|s| format!(" {}", s.as_str())).unwrap_or_default();
            return format!("endpoint {}: no{which} deliveries", args.id);
        }
        let rows: Vec<Vec<String>> = deliveries.iter().map(delivery_row).collect();
        let mut text = table(
            &["WEBHOOK ID", "JOB", "EVENT", "STATUS", "ATTEMPTS", "LAST ATTEMPT", "HTTP", "ERROR"],
            &rows,
        );
        if cursor.is_some() {
            text.push_str("\n(more: raise --limit or use --all)");
        }
        text
    });
    Ok(Exit::Ok)
}

/// `endpoint resend`: queues the delivery again.
async fn resend(api: &Api, out: &Output, delivery: &DeliveryRef) -> Result<Exit, CliError> {
    let id = &delivery.webhook_id;
    let reply = api.post_empty(&format!("/webhooks/deliveries/{id}/resend")).await?.body;
    out.print(&reply, || format!("delivery {id} queued again"));
    Ok(Exit::Ok)
}

/// How far a recovery went: the deliveries it queued again, in calls that all answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Deliveries queued again.
    pub requeued: u64,
    /// Calls made.
    pub calls: u32,
}

/// Calls `recover_once` (one `POST …/recover`, given the previous answer's `cursor`) until an
/// answer says the walk is `complete`. A failing call ends it: its error is returned with
/// what the calls before it queued.
pub async fn recover_all(
    mut recover_once: impl AsyncFnMut(Option<String>) -> Result<Value, CliError>,
) -> Result<Recovered, (Recovered, CliError)> {
    let mut done = Recovered { requeued: 0, calls: 0 };
    let mut cursor: Option<String> = None;
    loop {
        let answer = recover_once(cursor.clone()).await.map_err(|err| (done, err))?;
        done.calls += 1;
        done.requeued += answer.get("requeued").and_then(Value::as_u64).unwrap_or(0);
        if answer.get("complete").and_then(Value::as_bool) == Some(true) {
            return Ok(done);
        }
        let next = answer.get("cursor").and_then(Value::as_str).map(str::to_owned);
        if next.is_none() || next == cursor {
            let err = CliError::Protocol(format!(
                "the recovery is not complete but names no new cursor to go on from: {answer}"
            ));
            return Err((done, err));
        }
        cursor = next;
    }
}

/// `endpoint recover`: queues every failed delivery since `--since` again, calling the API
/// until it has walked them all; prints how many.
async fn recover(api: &Api, out: &Output, args: &EndpointRecover) -> Result<Exit, CliError> {
    let path = format!("{}/recover", endpoint_path(&args.id));
    let walked = recover_all(async |cursor: Option<String>| {
        let mut body = json!({ "since": args.since });
        if let Some(cursor) = cursor {
            body["cursor"] = cursor.into();
        }
        Ok(api.post(&path, &body).await?.body)
    })
    .await;
    let done = match walked {
        Ok(done) => done,
        Err((done, err)) => {
            if done.requeued > 0 {
                out.note(&format!(
                    "{} deliveries were queued again before this failure; repeat the command \
                     to go on (what is queued already is skipped)",
                    done.requeued
                ));
            }
            return Err(err);
        }
    };
    let document = json!({
        "endpoint_id": args.id, "since": args.since, "requeued": done.requeued, "complete": true,
    });
    out.print(&document, || {
        let noun = if done.requeued == 1 { "delivery" } else { "deliveries" };
        format!(
            "endpoint {}: {} failed {noun} since {} queued again",
            args.id, done.requeued, args.since
        )
    });
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parsed(args: &[&str]) -> EndpointCommand {
        let mut line = vec!["longhaul", "endpoint"];
        line.extend_from_slice(args);
        match Cli::try_parse_from(line).unwrap_or_else(|e| panic!("{args:?}: {e}")).command {
            Command::Endpoint(command) => command,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn create_sends_the_url_the_events_once_each_and_a_description() {
        let EndpointCommand::Create(args) =
            parsed(&["create", "--url", "https://example.com/hook", "--events", "job.failed"])
        else {
            panic!()
        };
        assert_eq!(
            create_body(&args),
            json!({"url": "https://example.com/hook", "events": ["job.failed"]})
        );
        let EndpointCommand::Create(args) = parsed(&[
            "create",
            "--url",
            "https://example.com/hook",
            "--events",
            "job.succeeded,job.failed",
            "--events",
            "job.progress,job.failed",
            "--description",
            "billing",
        ]) else {
            panic!()
        };
        assert_eq!(
            create_body(&args),
            json!({"url": "https://example.com/hook",
                "events": ["job.succeeded", "job.failed", "job.progress"], "description": "billing"})
        );
    }

    #[test]
    fn update_sends_only_what_changes() {
        let EndpointCommand::Update(args) = parsed(&["update", "e1", "--events", "job.cancelled"])
        else {
            panic!()
        };
        assert_eq!(args.id, "e1");
        assert_eq!(update_body(&args), json!({"events": ["job.cancelled"]}));
        let EndpointCommand::Update(args) =
            parsed(&["update", "e1", "--url", "https://example.com/v2", "--no-description"])
        else {
            panic!()
        };
        assert_eq!(
            update_body(&args),
            json!({"url": "https://example.com/v2", "description": null})
        );
        let EndpointCommand::Update(args) = parsed(&["update", "e1", "--description", "ops"])
        else {
            panic!()
        };
        assert_eq!(update_body(&args), json!({"description": "ops"}));
    }

    #[test]
    fn usage_errors_are_refused_before_any_request() {
        for args in [
            &["endpoint", "create", "--events", "job.failed"][..],
            &["endpoint", "create", "--url", "https://example.com/hook"],
            &["endpoint", "create", "--url", "https://x.example", "--events", "job.exploded"],
            &["endpoint", "create", "--url", "https://x.example", "--events", ""],
            &["endpoint", "update", "e1"],
            &["endpoint", "update", "e1", "--description", "x", "--no-description"],
            &["endpoint", "get"],
            &["endpoint", "deliveries", "e1", "--status", "lost"],
            &["endpoint", "deliveries", "e1", "--limit", "0"],
            &["endpoint", "recover", "e1"],
            &["endpoint", "resend"],
        ] {
            let mut line = vec!["longhaul"];
            line.extend_from_slice(args);
            let err = Cli::try_parse_from(line).expect_err(&format!("{args:?} is refused"));
            assert_eq!(err.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn deliveries_queries_carry_the_status_limit_and_cursor() {
        let EndpointCommand::Deliveries(args) =
            parsed(&["deliveries", "e1", "--status", "failed", "--limit", "5"])
        else {
            panic!()
        };
        assert_eq!((args.pages.limit, args.pages.all), (5, false));
        assert_eq!(
            deliveries_query(&args, 5, Some("c1")),
            vec![
                ("limit", "5".to_owned()),
                ("status", "failed".to_owned()),
                ("cursor", "c1".to_owned())
            ]
        );
        let EndpointCommand::Deliveries(args) = parsed(&["deliveries", "e1", "--all"]) else {
            panic!()
        };
        assert_eq!(deliveries_query(&args, 100, None), vec![("limit", "100".to_owned())]);
    }

    #[test]
    fn an_endpoint_row_says_why_it_is_failing_or_disabled() {
        let healthy = json!({"endpoint_id": "e1", "url": "https://example.com/hook",
            "events": ["job.failed", "job.succeeded"], "status": "enabled"});
        assert_eq!(
            list_row(&healthy),
            ["e1", "enabled", "https://example.com/hook", "job.failed,job.succeeded", "-"]
        );
        let failing = json!({"status": "enabled", "failing_since": "2026-11-24T10:00:00.000Z"});
        assert_eq!(health(&failing), "failing since 2026-11-24T10:00:00.000Z");
        let gone = json!({"status": "disabled", "disabled_reason": "gone",
            "disabled_at": "2026-11-25T10:00:00.000Z"});
        assert_eq!(health(&gone), "disabled (gone) at 2026-11-25T10:00:00.000Z");
    }

    #[test]
    fn a_delivery_row_names_its_webhook_id_and_last_attempt() {
        let delivery = json!({"webhook_id": "msg_a_b_succeeded", "job_id": "j1",
            "event": "job.succeeded", "status": "failed", "attempts": 4,
            "created_at": "2026-11-24T10:00:00.000Z", "last_attempt_at": "2026-11-24T10:00:03.000Z",
            "error": "connection refused"});
        assert_eq!(
            delivery_row(&delivery),
            [
                "msg_a_b_succeeded",
                "j1",
                "job.succeeded",
                "failed",
                "4",
                "2026-11-24T10:00:03.000Z",
                "-",
                "connection refused"
            ]
        );
    }

    /// Runs [`recover_all`] against `answers`, one per call; returns its outcome and the
    /// cursor each call was given.
    async fn recover_with(
        answers: Vec<Result<Value, CliError>>,
    ) -> (Result<Recovered, (Recovered, CliError)>, Vec<Option<String>>) {
        let mut answers = answers.into_iter();
        let mut given = Vec::new();
        let outcome = recover_all(async |cursor: Option<String>| {
            given.push(cursor);
            answers.next().expect("no call after the last answer")
        })
        .await;
        (outcome, given)
    }

    #[tokio::test]
    async fn recover_passes_each_cursor_back_until_the_walk_is_complete() {
        let (outcome, given) = recover_with(vec![
            Ok(json!({"requeued": 1000, "complete": false, "cursor": "c1"})),
            Ok(json!({"requeued": 7, "complete": false, "cursor": "c2"})),
            Ok(json!({"requeued": 0, "complete": true})),
        ])
        .await;
        assert_eq!(outcome.unwrap(), Recovered { requeued: 1007, calls: 3 });
        assert_eq!(given, [None, Some("c1".into()), Some("c2".into())]);
    }

    #[tokio::test]
    async fn recover_stops_at_a_failure_saying_what_was_queued_before() {
        let problem = crate::problem::Problem::from_answer(503, None, b"");
        let (outcome, _) = recover_with(vec![
            Ok(json!({"requeued": 12, "complete": false, "cursor": "c1"})),
            Err(CliError::Api(Box::new(problem))),
        ])
        .await;
        let (done, err) = outcome.unwrap_err();
        assert_eq!(done, Recovered { requeued: 12, calls: 1 });
        assert!(err.to_string().contains("HTTP 503"), "{err}");
    }

    #[tokio::test]
    async fn recover_refuses_an_incomplete_answer_without_a_new_cursor() {
        for stuck in [
            json!({"requeued": 3, "complete": false}),
            json!({"requeued": 3, "complete": false, "cursor": null}),
        ] {
            let (outcome, given) = recover_with(vec![Ok(stuck)]).await;
            let (done, err) = outcome.unwrap_err();
            assert_eq!((done.requeued, given.len()), (3, 1));
            assert!(matches!(err, CliError::Protocol(_)), "{err}");
        }
        let (outcome, given) = recover_with(vec![
            Ok(json!({"requeued": 1, "complete": false, "cursor": "same"})),
            Ok(json!({"requeued": 1, "complete": false, "cursor": "same"})),
        ])
        .await;
        assert!(matches!(outcome.unwrap_err().1, CliError::Protocol(_)));
        assert_eq!(given.len(), 2, "a cursor that does not move ends the walk");
    }
}
