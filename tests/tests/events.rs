//! The sample payloads in `events/`, fed to their functions' handlers against the local stack:
//! the HTTP ones straight to the handler (as lambda_http would), the others through the
//! Lambda Invoke API the edge serves.

use std::path::PathBuf;

use lambda_http::request::LambdaRequest;
use longhaul_aws::config::Vars;
use longhaul_local::function_identity;
use longhaul_tests::{harness, root};
use serde_json::Value;

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
        404,
        "a bad token reads as no such job"
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
    let (error, body) = invoke("StageFunction", sample("stage-claim.json")).await;
    assert_eq!(
        (error.as_deref(), body["errorType"].as_str()),
        (Some("Unhandled"), Some("Job.NotClaimable"))
    );
    let (error, body) = invoke("StageFunction", sample("stage-run.json")).await;
    assert_eq!(
        (error.as_deref(), body["errorType"].as_str()),
        (Some("Unhandled"), Some("Job.Fatal"))
    );
    for (logical, name) in [("ReaperFunction", "reaper.json"), ("ExpirerFunction", "expirer.json")]
    {
        let (error, body) = invoke(logical, sample(name)).await;
        assert_eq!(error, None, "{logical}: {body}");
        assert!(body.is_object(), "{logical} reports what it did: {body}");
    }
}
