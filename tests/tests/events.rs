//! The sample payloads in `events/`, fed to their functions' handlers against the local stack:
//! the HTTP ones straight to the handler (as lambda_http would), the others through the
//! Lambda Invoke API the edge serves. And the events function's refusal of bad stream tokens
//! before any database read, metered by the edge's per-function AWS call counter (nothing
//! else in this binary streams, so the events function's calls here are only this test's).

use std::collections::BTreeMap;
use std::path::PathBuf;

use lambda_http::request::LambdaRequest;
use longhaul_aws::config::Vars;
use longhaul_domain::stream_token;
use longhaul_local::function_identity;
use longhaul_tests::{Api, harness, principal, root};
use serde_json::{Value, json};

fn sample(name: &str) -> Value {
    let path: PathBuf = root().join("events").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn request(event: Value) -> lambda_http::Request {
    serde_json::from_value::<LambdaRequest>(event).expect("an API Gateway event").into()
}

fn vars(logical: &str) -> Vars {
    let functions = longhaul_local::model::functions(&harness().stack.template).unwrap();
    let spec = functions.into_iter().find(|f| f.logical == logical).unwrap();
    Vars::from_map(spec.env.into_iter().collect())
}

async fn invoke(logical: &str, event: Value) -> (Option<String>, Value) {
    let stack = &harness().stack;
    let url = format!(
        "{}/2015-03-31/functions/{}/invocations",
        stack.edge_url,
        stack.template.physical_name(logical).unwrap()
    );
    let response = reqwest::Client::new().post(url).json(&event).send().await.unwrap();
    let error =
        response.headers().get("x-amz-function-error").map(|v| v.to_str().unwrap().to_owned());
    (error, response.json().await.unwrap())
}

#[tokio::test]
async fn http_samples_drive_their_handlers() {
    let stack = &harness().stack;
    let sdk = longhaul_local::sdk_config(&stack.edge_url).await;
    let submit = submit::Deps::new(
        &function_identity(&sdk, "SubmitFunction"),
        &submit::Config::from_vars(&vars("SubmitFunction")).unwrap(),
    );
    let response = submit::handle(&submit, request(sample("submit.json"))).await;
    assert_eq!(response.status(), 202);
    let body: Value = serde_json::from_slice(response.body().as_ref()).unwrap();
    let job_id = body["job_id"].as_str().unwrap().to_owned();
    let with_job = |name: &str| {
        let text = serde_json::to_string(&sample(name))
            .unwrap()
            .replace("01a201ea-fb15-7355-87ef-3777d21385c6", &job_id);
        request(serde_json::from_str(&text).unwrap())
    };

    let status = status::Deps::new(
        &function_identity(&sdk, "StatusFunction"),
        &status::Config::from_vars(&vars("StatusFunction")).unwrap(),
    );
    assert_eq!(status::handle(&status, with_job("status.json")).await.status(), 200);
    let cancel = cancel::Deps::new(
        &function_identity(&sdk, "CancelFunction"),
        &cancel::Config::from_vars(&vars("CancelFunction")).unwrap(),
    );
    assert_eq!(cancel::handle(&cancel, with_job("cancel.json")).await.status(), 202);
    let uploads = uploads::Deps::new(
        &function_identity(&sdk, "UploadsFunction"),
        &uploads::Config::from_vars(&vars("UploadsFunction")).unwrap(),
    );
    assert_eq!(uploads::handle(&uploads, request(sample("uploads.json"))).await.status(), 201);
    let webhooks = webhooks::Deps::new(
        &function_identity(&sdk, "WebhooksFunction"),
        &webhooks::Config::from_vars(&vars("WebhooksFunction")).unwrap(),
    );
    assert_eq!(webhooks::handle(&webhooks, request(sample("webhooks.json"))).await.status(), 200);
    let events = std::sync::Arc::new(events::Deps::new(
        &function_identity(&sdk, "EventsFunction"),
        &events::Config::from_vars(&vars("EventsFunction")).unwrap(),
    ));
    assert_eq!(
        events::handle(events, with_job("events.json")).await.status(),
        401,
        "a bad token is refused before the job is read"
    );
}

#[tokio::test]
async fn event_samples_drive_their_handlers() {
    // A dispatch or a webhook for a job that does not exist is acknowledged, not retried.
    let (error, body) = invoke("DispatcherFunction", sample("dispatcher.json")).await;
    assert_eq!((error, body["batchItemFailures"].clone()), (None, serde_json::json!([])));
    let (error, body) = invoke("WebhookFunction", sample("webhook.json")).await;
    assert_eq!((error, body["batchItemFailures"].clone()), (None, serde_json::json!([])));
    // A job's end on the table's stream is queued as its webhook (whose delivery then finds
    // no such job and is acknowledged).
    let (error, body) = invoke("NotifierFunction", sample("notifier.json")).await;
    assert_eq!((error, body["batchItemFailures"].clone()), (None, serde_json::json!([])));
    // The stage refuses to claim or run a job that is not there, with the names the ASL matches.
    let (error, body) = invoke("StageFunction", sample("stage-work.json")).await;
    assert_eq!(
        (error.as_deref(), body["errorType"].as_str()),
        (Some("Unhandled"), Some("Job.NotClaimable"))
    );
    // A failure of an execution that never held the job records nothing; a continuation
    // under a lease that holds nothing is refused.
    let (error, body) = invoke("StageFunction", sample("stage-fail.json")).await;
    assert_eq!((error, body), (None, serde_json::json!({"next": "unrecorded"})));
    let (error, body) = invoke("StageFunction", sample("stage-continue.json")).await;
    assert_eq!(
        (error.as_deref(), body["errorType"].as_str()),
        (Some("Unhandled"), Some("Job.LeaseLost"))
    );
    for (logical, name) in [("ReaperFunction", "reaper.json"), ("ExpirerFunction", "expirer.json")]
    {
        let (error, body) = invoke(logical, sample(name)).await;
        assert_eq!(error, None, "{logical}: {body}");
        assert!(body.is_object(), "{logical} reports what it did: {body}");
    }
}

/// The events function's DynamoDB calls so far, by operation.
async fn events_dynamodb_calls() -> BTreeMap<String, u64> {
    let url = format!("{}/_local/aws-calls/by-function", harness().stack.api_url);
    let calls: BTreeMap<String, BTreeMap<String, u64>> =
        reqwest::get(url).await.unwrap().json().await.unwrap();
    calls
        .get("EventsFunction")
        .map(|c| c.iter().filter(|(op, _)| op.starts_with("dynamodb:")))
        .into_iter()
        .flatten()
        .map(|(op, n)| (op.clone(), *n))
        .collect()
}

/// `base` (an events URL without its query) with `token` (none: no `token` parameter).
fn with_token(base: &str, token: Option<&str>) -> reqwest::Url {
    let mut url = reqwest::Url::parse(base).unwrap();
    if let Some(token) = token {
        url.query_pairs_mut().append_pair("token", token);
    }
    url
}

/// GETs `url` and returns the status, content type and (for a problem) its JSON, without
/// reading a stream's body.
async fn get(url: reqwest::Url) -> (u16, String, Value) {
    let response = reqwest::get(url).await.unwrap();
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let content_type = content_type.unwrap_or_default();
    let body = if content_type == "application/problem+json" {
        response.json().await.unwrap()
    } else {
        Value::Null
    };
    (status, content_type, body)
}

#[tokio::test]
async fn bad_stream_tokens_are_refused_before_any_database_read() {
    let owner = principal("token-owner");
    let api = Api::new(&owner);
    let live = json!({"type": "demo", "params": {"items": 300, "item_ms": 100}});
    let job_id = api.submit(&live).await;
    let other_job =
        api.submit(&json!({"type": "demo", "params": {"items": 301, "item_ms": 100}})).await;
    let events_url = api.get(&format!("/jobs/{job_id}")).await.json["events_url"]
        .as_str()
        .expect("a live job has an events_url")
        .to_owned();
    let (base, query) = events_url.split_once("?token=").unwrap();
    let token = query.to_owned();
    // The key as the events function reads it: from Secrets Manager, by the ARN it is given.
    let config = events::Config::from_vars(&vars("EventsFunction")).unwrap();
    let sdk = harness().stack.emulator_sdk_config().await;
    let key = longhaul_aws::secrets::SecretKey::new(
        aws_sdk_secretsmanager::Client::new(&sdk),
        config.token_secret_arn,
    );
    let secret = secrecy::ExposeSecret::expose_secret(key.get().await.unwrap()).to_owned();
    let secret = secret.as_bytes();
    let now = chrono::Utc::now().timestamp();
    // `expiry.owner.mac`, each part changed in turn.
    let parts: Vec<&str> = token.split('.').collect();
    let with_part = |i: usize, part: &str| {
        let mut parts = parts.clone();
        parts[i] = part;
        parts.join(".")
    };
    let (expires, mac) = (parts[0], parts[parts.len() - 1]);
    let mallory = stream_token::issue(b"any", &job_id, &"mallory".parse().unwrap(), 0);
    let mallory_part = mallory.split('.').nth(1).unwrap();
    let flipped_mac = format!("{}{}", if mac.starts_with('A') { "B" } else { "A" }, &mac[1..]);
    let extended = (expires.parse::<i64>().unwrap() + 3600).to_string();

    let before = events_dynamodb_calls().await;
    let mut refused: Vec<(String, Option<String>)> = vec![
        (base.to_owned(), None),
        (base.to_owned(), Some(String::new())),
        (base.to_owned(), Some(format!("{expires}.{mac}"))),
        (base.to_owned(), Some(with_part(0, &extended))),
        (base.to_owned(), Some(with_part(1, mallory_part))),
        (base.to_owned(), Some(with_part(parts.len() - 1, &flipped_mac))),
        (base.to_owned(), Some(with_part(parts.len() - 1, ""))),
        (base.to_owned(), Some(stream_token::issue(b"not-the-key", &job_id, &owner, now + 600))),
        (base.to_owned(), Some(stream_token::issue(secret, &job_id, &owner, now - 60))),
        (base.replace(job_id.as_str(), &other_job), Some(token.clone())),
        (
            base.replace(job_id.as_str(), "01a201ea-fb15-7355-87ef-3777d21385c6"),
            Some(token.clone()),
        ),
    ];
    for garbage in [
        "garbage",
        "0.invalid",
        "1.AAAA",
        "...",
        "-1.-1.-1",
        "ü.ü.ü",
        "\0",
        "1.YQ==.AAAA",
        "99999999999999999999.YQ.AAAA",
    ] {
        refused.push((base.to_owned(), Some(garbage.to_owned())));
    }
    refused.push((base.to_owned(), Some("A".repeat(6000))));
    let mut answers = Vec::new();
    for (url, bad) in &refused {
        answers.push(get(with_token(url, bad.as_deref())).await);
    }
    let (_, _, expired) =
        get(with_token(base, Some(&stream_token::issue(secret, &job_id, &owner, now - 60)))).await;
    assert_eq!(
        events_dynamodb_calls().await,
        before,
        "refusing {} bad tokens read nothing",
        refused.len() + 1
    );
    for ((url, bad), (status, content_type, problem)) in refused.iter().zip(answers) {
        assert_eq!(
            (status, content_type.as_str(), problem["type"].as_str()),
            (401, "application/problem+json", Some("/problems/unauthorized")),
            "{url} with {bad:?}: {problem}"
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(!detail.contains(&token), "a refusal never echoes the token: {detail}");
    }
    assert!(expired["detail"].as_str().unwrap().contains("expired"), "{expired}");

    // Authentic tokens do read: the job, whose owner must be the token's (a token the key
    // signed for someone else opens nothing) — and the meter does see the function's reads.
    let (status, content_type, _) = get(with_token(
        base,
        Some(&stream_token::issue(secret, &job_id, &"mallory".parse().unwrap(), now + 600)),
    ))
    .await;
    assert_eq!((status, content_type.as_str()), (404, "application/problem+json"));
    let (status, content_type, _) = get(with_token(base, Some(&token))).await;
    assert_eq!((status, content_type.as_str()), (200, "text/event-stream"));
    let after = events_dynamodb_calls().await;
    assert!(after.values().sum::<u64>() >= before.values().sum::<u64>() + 2, "{after:?}");
}
