//! The edge: the AWS endpoint the hosted functions (and moto's Step Functions interpreter)
//! talk to. It serves the Lambda Invoke API by calling the hosted handlers, forwards every
//! other request to the emulator, and counts AWS calls per `service:operation`. Every call a
//! hosted function makes is first checked against its role's policies in the template
//! (`crate::checks::iam`), and refused as AWS would refuse it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::TryStreamExt;

use crate::checks::faults::{FUNCTION_HEADER, Faults, INVOCATION_HEADER, LEASE_HEADER};
use crate::checks::iam::{Credential, Denial, Policies};
use crate::hosting::hosted::HostedFunction;
use crate::hosting::operations::classify;

/// Counts of AWS API calls by `service:operation`, and by function and operation.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    by_operation: Arc<Mutex<BTreeMap<String, u64>>>,
    by_function: Arc<Mutex<BTreeMap<String, BTreeMap<String, u64>>>>,
}

impl CallCounter {
    /// Counts one call of `key` (`service:Operation`), made by `function` (its logical name;
    /// `None` when no hosted function made it, e.g. moto's interpreter invoking a task).
    pub fn record(&self, key: String, function: Option<&str>) {
        if let Some(function) = function {
            let mut by_function = self.by_function.lock().expect("counter lock");
            *by_function.entry(function.to_owned()).or_default().entry(key.clone()).or_default() +=
                1;
        }
        *self.by_operation.lock().expect("counter lock").entry(key).or_default() += 1;
    }

    /// The counts so far, by `service:operation`.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.by_operation.lock().expect("counter lock").clone()
    }

    /// The counts so far, by function, then `service:operation`.
    pub fn by_function(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        self.by_function.lock().expect("counter lock").clone()
    }
}

/// What the edge needs.
#[derive(Clone)]
pub struct EdgeState {
    /// Hosted functions by physical name.
    pub functions: Arc<HashMap<String, HostedFunction>>,
    /// The call counter.
    pub calls: CallCounter,
    /// Where the emulator listens.
    pub emulator_url: String,
    /// The forwarding client.
    pub client: reqwest::Client,
    /// Held exclusively while a DynamoDB write is in the emulator, shared by reads. DynamoDB
    /// applies each write atomically; moto evaluates a condition and then changes the item
    /// attribute by attribute on a threaded server (and rolls a failed transaction back by
    /// restoring a copy of the whole table), so concurrent writes could both pass one
    /// condition or undo each other, and a read could see half an update. Writes one at a
    /// time, never overlapping a read, restores DynamoDB's guarantees at the cost of local
    /// throughput only.
    pub dynamodb_lock: Arc<tokio::sync::RwLock<()>>,
    /// Throttling to inject and the journal of DynamoDB writes.
    pub faults: Arc<Faults>,
    /// The template's role policies, enforced on every call a hosted function makes.
    pub policies: Arc<Policies>,
    /// Every call refused so far (`GET /_local/iam/denials`).
    pub denials: Denials,
    /// The emulator's SQS, where Lambda's record of an asynchronous invocation it gave up on
    /// goes (a function's on-failure destination).
    pub sqs: aws_sdk_sqs::Client,
}

/// The calls the edge refused for want of a permission, in order.
#[derive(Debug, Clone, Default)]
pub struct Denials(Arc<Mutex<Vec<Denial>>>);

impl Denials {
    /// Records (and logs) a refusal.
    pub(crate) fn record(&self, denial: Denial) {
        tracing::error!(
            principal = denial.principal,
            action = denial.action,
            resource = denial.resource,
            "AccessDenied: {}",
            denial.message
        );
        self.0.lock().expect("denials lock").push(denial);
    }

    /// The refusals so far.
    pub fn snapshot(&self) -> Vec<Denial> {
        self.0.lock().expect("denials lock").clone()
    }
}

/// DynamoDB operations that change data.
const DYNAMODB_WRITES: [&str; 6] = [
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:TransactWriteItems",
    "dynamodb:ExecuteStatement",
];

/// The edge's router.
pub fn router(state: EdgeState) -> axum::Router {
    axum::Router::new()
        .route("/2015-03-31/functions/{function}/invocations", post(invoke))
        .fallback(forward)
        .with_state(state)
}

async fn invoke(
    State(state): State<EdgeState>,
    Path(function): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let caller = headers.get(FUNCTION_HEADER).and_then(|v| v.to_str().ok());
    state.calls.record("lambda:Invoke".into(), caller);
    // A hosted function's invocation of another is throttled as any of its calls may be.
    if caller.is_some()
        && state.faults.throttle_call(
            "lambda:Invoke",
            &format!("/2015-03-31/functions/{function}/invocations"),
            &body,
        )
    {
        return throttled("lambda:Invoke");
    }
    // The path carries a name, an ARN, or a partial ARN (…:function:name[:qualifier]).
    let name = match function.split_once(":function:") {
        Some((_, rest)) => rest.split(':').next().unwrap_or(rest).to_owned(),
        None => function.clone(),
    };
    // The emulator's Step Functions interpreter signs with a key of its own (whatever its
    // environment says): a signed call by neither the administrator nor a function is a state
    // machine's, whose role must grant it. Tests calling this API unsigned play the
    // administrator.
    let function_arn = crate::stack::template::function_arn(&name);
    let verdict = match Credential::of(&Uri::from_static("/"), &headers).map(|c| c.key) {
        None => Ok(()),
        Some(key) if key == crate::checks::iam::ADMIN_KEY => Ok(()),
        // A hosted function invoking another: its own role must grant it.
        Some(key) if state.policies.knows(&key) => {
            state.policies.check(&key, &[crate::checks::iam::Access::invoke(&function_arn)])
        }
        Some(_) => state.policies.check_invoke(&function_arn),
    };
    if let Err(denial) = verdict {
        state.denials.record(denial.clone());
        return access_denied("lambda:Invoke", &denial.message);
    }
    let Some(hosted) = state.functions.get(&name) else {
        return (
            StatusCode::NOT_FOUND,
            [("x-amzn-errortype", "ResourceNotFoundException")],
            axum::Json(serde_json::json!({"Type": "User", "message": format!("Function not found: {function}")})),
        )
            .into_response();
    };
    let event: serde_json::Value = if body.is_empty() {
        serde_json::json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(event) => event,
            Err(e) => {
                return (
                    StatusCode::BAD_REQUEST,
                    [("x-amzn-errortype", "InvalidRequestContentException")],
                    axum::Json(serde_json::json!({"Type": "User", "message": e.to_string()})),
                )
                    .into_response();
            }
        }
    };
    match headers.get("x-amz-invocation-type").and_then(|v| v.to_str().ok()) {
        Some("Event") => {
            // Lambda may deliver an event more than once (a fault plan makes it so).
            if caller.is_some() && state.faults.duplicate_start() {
                tokio::spawn(invoke_async(hosted.clone(), event.clone(), state.sqs.clone()));
            }
            tokio::spawn(invoke_async(hosted.clone(), event, state.sqs.clone()));
            return StatusCode::ACCEPTED.into_response();
        }
        Some("DryRun") => return StatusCode::NO_CONTENT.into_response(),
        _ => {}
    }
    match hosted.invoke(event).await {
        Ok(output) => (StatusCode::OK, [("x-amz-executed-version", "$LATEST")], axum::Json(output))
            .into_response(),
        Err(diagnostic) => {
            tracing::info!(function = name, error_type = diagnostic.error_type, "function error");
            (
                StatusCode::OK,
                [("x-amz-executed-version", "$LATEST"), ("x-amz-function-error", "Unhandled")],
                axum::Json(serde_json::json!({
                    "errorType": diagnostic.error_type,
                    "errorMessage": diagnostic.error_message,
                })),
            )
                .into_response()
        }
    }
}

/// How long Lambda waits before its `retry`-th retry of a failed asynchronous invocation: a
/// minute, then two (shortened here 60-fold, as a test's patience is).
fn async_retry_delay(retry: u32) -> std::time::Duration {
    std::time::Duration::from_secs(u64::from(retry))
}

/// Runs an asynchronous invocation as Lambda does: the event is queued (the caller has its
/// `202`), a failed invocation is retried (`MaximumRetryAttempts`, after
/// [`async_retry_delay`]), and Lambda's record of one it gave up on goes to the function's
/// SQS on-failure destination (else it is dropped, with an error in the log, as Lambda drops
/// it when there is none).
async fn invoke_async(hosted: HostedFunction, event: serde_json::Value, sqs: aws_sdk_sqs::Client) {
    let config = hosted.spec.async_invoke.clone();
    let mut tries = 0;
    let failure = loop {
        tries += 1;
        match hosted.invoke(event.clone()).await {
            Ok(_) => return,
            Err(diagnostic) if hosted.loses_event(&event) => {
                tracing::warn!(
                    function = hosted.spec.logical,
                    error_type = diagnostic.error_type,
                    "asynchronous invocation failed; its event is lost (a test's crash for good)"
                );
                return;
            }
            Err(diagnostic) if tries > config.max_retries => break diagnostic,
            Err(diagnostic) => {
                tracing::info!(
                    function = hosted.spec.logical,
                    error_type = diagnostic.error_type,
                    tries,
                    "asynchronous invocation failed; Lambda retries it"
                );
                tokio::time::sleep(async_retry_delay(tries)).await;
            }
        }
    };
    let Some(queue_url) = config.on_failure_queue_url else {
        tracing::error!(
            function = hosted.spec.logical,
            error_type = failure.error_type,
            "asynchronous invocation failed on every try; no on-failure destination, dropped"
        );
        return;
    };
    let function_arn = crate::stack::template::function_arn(&hosted.spec.name);
    let record = serde_json::json!({
        "version": "1.0",
        "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "requestContext": {
            "requestId": uuid::Uuid::new_v4().to_string(),
            "functionArn": format!("{function_arn}:$LATEST"),
            "condition": "RetriesExhausted",
            "approximateInvokeCount": tries,
        },
        "requestPayload": event,
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
        "responsePayload": {"errorType": failure.error_type, "errorMessage": failure.error_message},
    });
    tracing::warn!(
        function = hosted.spec.logical,
        error_type = failure.error_type,
        tries,
        "asynchronous invocation failed on every try; its record goes to the on-failure destination"
    );
    if let Err(err) =
        sqs.send_message().queue_url(&queue_url).message_body(record.to_string()).send().await
    {
        tracing::error!(function = hosted.spec.logical, error = %aws_sdk_sqs::error::DisplayErrorContext(&err), "sending to the on-failure destination failed; the record is lost");
    }
}

async fn forward(State(state): State<EdgeState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let operation = classify(&parts.method, &parts.uri, &parts.headers);
    let dynamodb = operation.starts_with("dynamodb:");
    let write = DYNAMODB_WRITES.contains(&operation.as_str());
    let function = parts.headers.get(FUNCTION_HEADER).and_then(|v| v.to_str().ok());
    state.calls.record(operation.clone(), function);
    let writer_lease =
        parts.headers.get(LEASE_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let invocation = parts
        .headers
        .get(INVOCATION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    // Buffered, not streamed: werkzeug (under moto) does not read chunked request bodies.
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(body) => body,
        Err(err) => return (StatusCode::BAD_REQUEST, err.to_string()).into_response(),
    };
    // Only SDK calls (signed in the Authorization header) are throttled: presigned URLs are
    // followed by plain HTTP clients, which do not retry.
    if parts.headers.contains_key("authorization")
        && state.faults.throttle_call(&operation, path, &body)
    {
        return throttled(&operation);
    }
    if state.faults.deny_call(&operation, path, &body) {
        return access_denied(&operation, &injected_denial(&operation, &parts.uri, &parts.headers));
    }
    // A CORS preflight (a browser's OPTIONS before a presigned PUT) is not an authorised call:
    // S3 answers it from the bucket's CORS rules alone, whatever credential its URL names.
    let principal = Credential::of(&parts.uri, &parts.headers)
        .map(|c| c.key)
        .filter(|p| state.policies.knows(p))
        .filter(|_| parts.method != Method::OPTIONS);
    if let Some(principal) = &principal {
        let verdict = state
            .policies
            .accesses(&operation, &parts.method, &parts.uri, &parts.headers, &body)
            .map_err(|unknown| Denial {
                principal: principal.clone(),
                action: operation.clone(),
                resource: parts.uri.path().to_owned(),
                message: format!(
                    "the local IAM check cannot name what this request needs: {unknown:#}"
                ),
            })
            .and_then(|accesses| state.policies.check(principal, &accesses));
        if let Err(denial) = verdict {
            state.denials.record(denial.clone());
            return access_denied(&operation, &denial.message);
        }
    }
    let journal_request = (write && state.faults.journaling()).then(|| body.clone());
    let mut outbound = state
        .client
        .request(parts.method.clone(), format!("{}{path}", state.emulator_url))
        .body(body);
    for (name, value) in &parts.headers {
        if name != "host"
            && name != "content-length"
            && name != LEASE_HEADER
            && name != FUNCTION_HEADER
            && name != INVOCATION_HEADER
        {
            outbound = outbound.header(name, value);
        }
    }
    if operation == "states:StartExecution"
        && state.faults.duplicate_start()
        && let Some(first) = outbound.try_clone()
    {
        // The first delivery takes effect and its answer is lost: the caller sees the
        // second's, as when the SDK retries a call whose answer timed out.
        match first.send().await {
            Ok(lost) => drop(lost.bytes().await),
            Err(err) => return emulator_unreachable(err),
        }
    }
    if !dynamodb {
        return match outbound.send().await {
            // S3 hides whether a key exists from a caller that may not list its bucket.
            Ok(response)
                if response.status() == StatusCode::NOT_FOUND
                    && matches!(operation.as_str(), "s3:GetObject" | "s3:HeadObject")
                    && principal
                        .as_deref()
                        .is_some_and(|p| state.policies.hides_missing_keys(p, &parts.uri)) =>
            {
                tracing::warn!(
                    operation,
                    "a missing key read by a caller that may not list the bucket: 403, as S3 answers"
                );
                access_denied(
                    &operation,
                    "Access Denied (the key does not exist, and the caller may not list the bucket)",
                )
            }
            // moto (5.2) answers ListParts with a `ListPartsResponse` root, which the SDK (like
            // S3's own answer) expects as `ListPartsResult`: renamed here, as S3 names it.
            Ok(response) if operation == "s3:ListParts" && response.status().is_success() => {
                let mut builder = Response::builder().status(response.status());
                for (name, value) in response.headers() {
                    if name != axum::http::header::CONTENT_LENGTH {
                        builder = builder.header(name, value);
                    }
                }
                match response.text().await {
                    Ok(text) => builder
                        .body(Body::from(text.replace("ListPartsResponse", "ListPartsResult")))
                        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()),
                    Err(err) => emulator_unreachable(err),
                }
            }
            Ok(response) => {
                let builder = response_builder(&response);
                let body =
                    Body::from_stream(response.bytes_stream().map_err(std::io::Error::other));
                builder.body(body).unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
            }
            Err(err) => emulator_unreachable(err),
        };
    }
    // A DynamoDB request runs to its end in a task of its own, holding the lock throughout,
    // even if the caller goes away meanwhile (an invocation crashed or timed out with this
    // call in flight): moto goes on applying a request it has received, so releasing the lock
    // when the caller hangs up would let the next write run alongside it, and two conditional
    // writes could both pass (a job dispatched twice was seen exactly so). DynamoDB, too,
    // applies a write it received whether or not anyone reads the answer.
    let lock = state.dynamodb_lock.clone();
    let faults = state.faults.clone();
    let exchange = tokio::spawn(async move {
        let _write = if write { Some(lock.clone().write_owned().await) } else { None };
        let _read = if write { None } else { Some(lock.read_owned().await) };
        let response = outbound.send().await?;
        let builder = response_builder(&response);
        let status = response.status();
        // Read the whole (small) answer before letting the next write in.
        let answer = response.bytes().await?;
        if let Some(request) = &journal_request {
            let refused = !status.is_success()
                && writer_lease.is_some()
                && String::from_utf8_lossy(&answer).contains("ConditionalCheckFailedException");
            if status.is_success() || refused {
                faults.journal_write(
                    &operation,
                    writer_lease,
                    invocation,
                    status.is_success(),
                    request,
                    &answer,
                );
            }
        }
        Ok::<_, reqwest::Error>((builder, answer))
    });
    match exchange.await {
        Ok(Ok((builder, answer))) => builder
            .body(Body::from(answer))
            .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()),
        Ok(Err(err)) => emulator_unreachable(err),
        Err(join_error) => (StatusCode::BAD_GATEWAY, join_error.to_string()).into_response(),
    }
}

/// A response builder with the emulator's status and headers.
fn response_builder(response: &reqwest::Response) -> axum::http::response::Builder {
    let mut builder = Response::builder().status(response.status());
    for (name, value) in response.headers() {
        builder = builder.header(name, value);
    }
    builder
}

/// The answer when the emulator could not be reached (or hung up mid-answer).
fn emulator_unreachable(err: reqwest::Error) -> Response {
    tracing::warn!(error = %err, "forwarding to the emulator failed");
    (
        StatusCode::BAD_GATEWAY,
        [("content-type", HeaderValue::from_static("text/plain"))],
        err.to_string(),
    )
        .into_response()
}

/// The error the service behind `operation` answers a call its caller may not make with.
fn access_denied(operation: &str, message: &str) -> Response {
    // The REST-JSON services (Lambda, EventBridge Scheduler) answer it with 403.
    let json_status = if operation.starts_with("lambda:") || operation.starts_with("scheduler:") {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::BAD_REQUEST
    };
    aws_error(
        operation,
        (StatusCode::FORBIDDEN, "AccessDenied"),
        (json_status, "AccessDeniedException"),
        message,
    )
}

/// The message of an injected denial ([`crate::checks::faults::FaultPlan::deny`]), as IAM words a
/// refusal: the caller's role and account, the action, the resource (an S3 object's ARN).
fn injected_denial(operation: &str, uri: &Uri, headers: &HeaderMap) -> String {
    let principal = Credential::of(uri, headers).map_or_else(|| "Unknown".into(), |c| c.key);
    let resource = if operation.starts_with("s3:") {
        format!("arn:aws:s3:::{}", uri.path().trim_start_matches('/'))
    } else {
        uri.path().to_owned()
    };
    format!(
        "User: arn:aws:sts::{}:assumed-role/{principal}Role/{principal} is not authorized to perform: {operation} on resource: {resource} (denial injected by the local edge)",
        crate::stack::template::ACCOUNT
    )
}

/// The throttling error the service behind `operation` answers with when it sheds load.
fn throttled(operation: &str) -> Response {
    let message = "Rate exceeded (throttling injected by the local edge)";
    aws_error(
        operation,
        (StatusCode::SERVICE_UNAVAILABLE, "SlowDown"),
        (StatusCode::BAD_REQUEST, "ThrottlingException"),
        message,
    )
}

/// An error answer in the wire format of the service behind `operation`: S3's XML `<Error>`
/// with `s3`'s status and code, or the AWS JSON protocols' `__type` (DynamoDB, SQS, Step
/// Functions, Lambda) with `json`'s.
fn aws_error(
    operation: &str,
    s3: (StatusCode, &str),
    json: (StatusCode, &str),
    message: &str,
) -> Response {
    if operation.starts_with("s3:") {
        let message = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>{message}</Message></Error>",
            s3.1
        );
        return (s3.0, [("content-type", "application/xml")], xml).into_response();
    }
    (
        json.0,
        [("content-type", "application/x-amz-json-1.0"), ("x-amzn-errortype", json.1)],
        serde_json::json!({"__type": json.1, "message": message}).to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write whose caller hangs up while the emulator is still applying it keeps the lock
    /// until the emulator answers: the next write never runs alongside it (moto would let two
    /// conditional writes both pass). The upstream here stands in for moto only to be slow
    /// and to count how many requests it holds at once.
    #[tokio::test]
    async fn a_write_keeps_the_lock_after_its_caller_hangs_up() {
        longhaul_aws::sdk::install_tls_provider();
        use std::sync::atomic::{AtomicUsize, Ordering};
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let upstream = {
            let (in_flight, most) = (in_flight.clone(), most.clone());
            axum::Router::new().fallback(move || {
                let (in_flight, most) = (in_flight.clone(), most.clone());
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    "{}"
                }
            })
        };
        let serve = |router: axum::Router| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
            format!("http://{address}")
        };
        let emulator_url = serve(upstream).await;
        let edge = serve(router(EdgeState {
            functions: Default::default(),
            calls: CallCounter::default(),
            emulator_url,
            client: reqwest::Client::new(),
            dynamodb_lock: Default::default(),
            faults: Default::default(),
            policies: Default::default(),
            denials: Default::default(),
            sqs: aws_sdk_sqs::Client::from_conf(
                aws_sdk_sqs::Config::builder()
                    .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
                    .build(),
            ),
        }))
        .await;
        let write = |timeout_ms: u64| {
            reqwest::Client::new()
                .post(&edge)
                .header("authorization", "AWS4-HMAC-SHA256 Credential=test/20261122/us-east-1/dynamodb/aws4_request, SignedHeaders=x")
                .header("x-amz-target", "DynamoDB_20120810.UpdateItem")
                .body("{}")
                .timeout(std::time::Duration::from_millis(timeout_ms))
                .send()
        };
        let abandoned = write(100).await;
        assert!(abandoned.is_err_and(|e| e.is_timeout()), "the first caller gives up mid-write");
        let answered = write(5_000).await.expect("the second write is answered");
        assert_eq!(answered.status(), StatusCode::OK);
        assert_eq!(most.load(Ordering::SeqCst), 1, "the emulator held two writes at once");
    }
}
