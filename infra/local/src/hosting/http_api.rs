//! The local HTTP API: API Gateway (HTTP API, payload 2.0, JWT authorizer) in front of the
//! hosted API functions, plus the local-only `/_local/` routes.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use lambda_http::request::LambdaRequest;
use serde_json::{Value, json};

use crate::hosting::edge::CallCounter;
use crate::hosting::hosted::{HostedFunction, gateway_error};
use crate::hosting::jwt::Authorizer;
use crate::stack::model::EventSpec;
use crate::triggers::schedules::Schedules;

/// API Gateway's payload limit for HTTP APIs.
pub const MAX_PAYLOAD_BYTES: usize = 10 * 1024 * 1024;

/// The last EMF lines the hosted functions printed (at most 10,000).
#[derive(Clone, Default)]
pub struct MetricLines(Arc<std::sync::Mutex<std::collections::VecDeque<String>>>);

impl MetricLines {
    /// Records one line.
    pub fn record(&self, line: &str) {
        let mut lines = self.0.lock().expect("metrics lock");
        if lines.len() == 10_000 {
            lines.pop_front();
        }
        lines.push_back(line.to_owned());
    }

    /// The recorded lines, parsed.
    pub fn parsed(&self) -> Vec<Value> {
        self.0
            .lock()
            .expect("metrics lock")
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// One route of the HTTP API.
#[derive(Clone)]
pub struct Route {
    method: String,
    path: String,
    segments: Vec<String>,
    authorized: bool,
    function: HostedFunction,
}

/// What the API server needs.
#[derive(Clone)]
pub struct ApiState {
    /// The routes.
    pub routes: Arc<Vec<Route>>,
    /// The JWT authorizer.
    pub authorizer: Authorizer,
    /// AWS call counts (`GET /_local/aws-calls`).
    pub calls: CallCounter,
    /// Schedules (`POST /_local/schedules/{name}`).
    pub schedules: Schedules,
    /// EventBridge Scheduler's firer (`POST /_local/scheduler/{name}`).
    pub scheduler: crate::triggers::scheduler::Firer,
    /// Every hosted function (`POST /_local/functions/{name}/crash`).
    pub functions: Arc<Vec<HostedFunction>>,
    /// EMF lines (`GET /_local/metrics`).
    pub metrics: MetricLines,
    /// The fault injector (`/_local/faults`, `/_local/journal`).
    pub faults: Arc<crate::checks::faults::Faults>,
    /// Finished invocations (`GET /_local/invocations`).
    pub invocations: crate::hosting::hosted::InvocationLog,
    /// Calls refused by the IAM check (`GET /_local/iam/denials`).
    pub denials: crate::hosting::edge::Denials,
    /// The HTTP API's CORS configuration, applied as API Gateway does.
    pub cors: Option<crate::stack::model::UrlCors>,
}

/// The routes of every hosted API function.
pub fn routes(functions: &[HostedFunction]) -> Vec<Route> {
    let mut routes: Vec<Route> = functions
        .iter()
        .flat_map(|f| {
            f.spec.events.iter().filter_map(move |event| match event {
                EventSpec::Http { method, path, authorized } => Some(Route {
                    method: method.clone(),
                    path: path.clone(),
                    segments: path.trim_start_matches('/').split('/').map(str::to_owned).collect(),
                    authorized: *authorized,
                    function: f.clone(),
                }),
                _ => None,
            })
        })
        .collect();
    // API Gateway prefers the most specific route: fewer parameters, then no greedy proxy.
    routes.sort_by_key(|r| {
        (
            r.segments.iter().any(|s| s.ends_with("+}")),
            r.segments.iter().filter(|s| s.starts_with('{')).count(),
            r.method == "ANY",
        )
    });
    routes
}

impl Route {
    /// The path parameters if `method path` matches this route.
    fn matches(&self, method: &str, path: &str) -> Option<BTreeMap<String, String>> {
        if self.method != "ANY" && self.method != method {
            return None;
        }
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let mut params = BTreeMap::new();
        for (i, segment) in self.segments.iter().enumerate() {
            if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix("+}")) {
                params.insert(name.to_owned(), parts.get(i..)?.join("/"));
                return Some(params);
            }
            let part = *parts.get(i)?;
            match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) if !part.is_empty() => {
                    let decoded = percent_decode(part)?;
                    params.insert(name.to_owned(), decoded);
                }
                Some(_) => return None,
                None if segment == part => {}
                None => return None,
            }
        }
        (parts.len() == self.segments.len()).then_some(params)
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The API router.
pub fn router(state: ApiState) -> axum::Router {
    axum::Router::new()
        .route("/_local/aws-calls", axum::routing::get(aws_calls))
        .route(
            "/_local/aws-calls/by-function",
            axum::routing::get(|State(state): State<ApiState>| async move {
                axum::Json(state.calls.by_function()).into_response()
            }),
        )
        .route(
            "/_local/iam/denials",
            axum::routing::get(|State(state): State<ApiState>| async move {
                axum::Json(state.denials.snapshot())
            }),
        )
        .route(
            "/_local/invocations",
            axum::routing::get(|State(state): State<ApiState>| async move {
                axum::Json(state.invocations.snapshot()).into_response()
            }),
        )
        .route(
            "/_local/metrics",
            axum::routing::get(|State(state): State<ApiState>| async move {
                axum::Json(state.metrics.parsed()).into_response()
            }),
        )
        .route("/_local/schedules/{name}", axum::routing::post(fire_schedule))
        .route("/_local/scheduler/{name}", axum::routing::post(fire_scheduler_schedule))
        .route("/_local/functions/{name}/crash", axum::routing::post(crash_function))
        .route("/_local/faults", axum::routing::get(faults).post(set_faults))
        .route(
            "/_local/journal",
            axum::routing::get(|State(state): State<ApiState>| async move {
                axum::Json(state.faults.journal())
            }),
        )
        .route("/_fn/{logical}/{*rest}", axum::routing::any(function_url))
        .fallback(serve)
        .with_state(state)
}

async fn aws_calls(State(state): State<ApiState>) -> Response {
    axum::Json(state.calls.snapshot()).into_response()
}

/// The fault plan in force and the faults injected so far.
async fn faults(State(state): State<ApiState>) -> Response {
    axum::Json(json!({"plan": state.faults.plan(), "injected": state.faults.counts()}))
        .into_response()
}

/// Installs a fault plan (resetting counts and the journal); `{}` turns faults off.
async fn set_faults(State(state): State<ApiState>, body: axum::body::Bytes) -> Response {
    match serde_json::from_slice::<crate::checks::faults::FaultPlan>(&body) {
        Ok(plan) => {
            state.faults.set_plan(plan);
            faults(State(state)).await
        }
        Err(err) => {
            (StatusCode::BAD_REQUEST, axum::Json(json!({"error": err.to_string()}))).into_response()
        }
    }
}

async fn fire_schedule(
    State(state): State<ApiState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    match state.schedules.fire(&name).await {
        None => (StatusCode::NOT_FOUND, axum::Json(json!({"message": format!("no schedule named {name}")}))).into_response(),
        Some(Ok(output)) => axum::Json(json!({"schedule": name, "output": output})).into_response(),
        Some(Err(diagnostic)) => (
            StatusCode::BAD_GATEWAY,
            axum::Json(json!({"schedule": name, "errorType": diagnostic.error_type, "errorMessage": diagnostic.error_message})),
        )
            .into_response(),
    }
}

/// Fires the next tick of an EventBridge Scheduler schedule (`?group=`: of that group; else of
/// any of the template's groups) now.
async fn fire_scheduler_schedule(
    State(state): State<ApiState>,
    axum::extract::Path(name): axum::extract::Path<String>,
    axum::extract::Query(query): axum::extract::Query<BTreeMap<String, String>>,
) -> Response {
    use crate::triggers::scheduler::NotFired;
    match state.scheduler.fire_next(&name, query.get("group").map(String::as_str)).await {
        Ok(fired) => axum::Json(fired).into_response(),
        Err(err) => {
            let status = match &err {
                NotFired::NotFound(_) => StatusCode::NOT_FOUND,
                NotFired::Disabled(_) | NotFired::NoTick(..) => StatusCode::CONFLICT,
                NotFired::Failed(_) => StatusCode::BAD_GATEWAY,
            };
            (status, axum::Json(json!({"message": format!("{err:#}")}))).into_response()
        }
    }
}

/// Fault injection: kill the in-flight invocations of a function (by logical id or name),
/// or with `?job_id=` only those working on that job.
async fn crash_function(
    State(state): State<ApiState>,
    axum::extract::Path(name): axum::extract::Path<String>,
    axum::extract::Query(query): axum::extract::Query<BTreeMap<String, String>>,
) -> Response {
    let job_id = query.get("job_id").map(String::as_str);
    // `for_good=true` (with a job): Lambda loses the crashed invocation's event, so nothing
    // retries it.
    let for_good = query.get("for_good").is_some_and(|v| v == "true");
    match state.functions.iter().find(|f| f.spec.logical == name || f.spec.name == name) {
        Some(function) => {
            let crashed = match job_id {
                Some(job_id) if for_good => function.crash_for_good(job_id),
                _ => function.crash(job_id),
            };
            axum::Json(json!({"function": function.spec.logical, "crashed": crashed}))
                .into_response()
        }
        None => {
            (StatusCode::NOT_FOUND, axum::Json(json!({"message": format!("no function {name}")})))
                .into_response()
        }
    }
}

/// A function URL: the same payload 2.0 event, no authorizer (the function authenticates).
/// Its `Cors` configuration is applied here, as Lambda applies it: a preflight is answered
/// without invoking the function, and an allowed origin's answer carries
/// `Access-Control-Allow-Origin`.
async fn function_url(
    State(state): State<ApiState>,
    path: axum::extract::Path<(String, String)>,
    request: Request,
) -> Response {
    let cors = state.functions.iter().find(|f| f.spec.logical == path.0.0).and_then(|f| {
        f.spec.events.iter().find_map(|e| match e {
            EventSpec::Url { cors, .. } => cors.clone(),
            _ => None,
        })
    });
    let origin = request.headers().get("origin").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let allowed = cors.as_ref().zip(origin.as_deref()).and_then(|(c, o)| c.allow_origin(o));
    let preflight = request.method() == axum::http::Method::OPTIONS
        && request.headers().contains_key("access-control-request-method");
    if let (true, Some(cors)) = (preflight, &cors) {
        let mut response = StatusCode::OK.into_response();
        if let Some(allowed) = &allowed {
            let headers = response.headers_mut();
            let mut set = |name: &'static str, value: String| {
                if let Ok(value) = value.parse() {
                    headers.insert(name, value);
                }
            };
            set("access-control-allow-origin", allowed.clone());
            set("access-control-allow-methods", cors.allow_methods.join(","));
            set("access-control-allow-headers", cors.allow_headers.join(","));
            if let Some(max_age) = cors.max_age {
                set("access-control-max-age", max_age.to_string());
            }
            set("vary", "Origin".into());
        }
        return response;
    }
    let mut response = function_url_invoke(State(state), path, request).await;
    if let Some(allowed) = allowed
        && let Ok(value) = allowed.parse()
    {
        response.headers_mut().insert("access-control-allow-origin", value);
        response.headers_mut().insert("vary", axum::http::HeaderValue::from_static("Origin"));
    }
    response
}

async fn function_url_invoke(
    State(state): State<ApiState>,
    axum::extract::Path((logical, rest)): axum::extract::Path<(String, String)>,
    request: Request,
) -> Response {
    let Some(function) = state.functions.iter().find(|f| {
        f.spec.logical == logical
            && f.spec.events.iter().any(|e| matches!(e, EventSpec::Url { .. }))
    }) else {
        return to_axum(gateway_error(404, "Not Found"));
    };
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_PAYLOAD_BYTES).await {
        Ok(body) => body,
        Err(_) => return to_axum(gateway_error(413, "Request Entity Too Large")),
    };
    let path = format!("/{rest}");
    let uri: axum::http::Uri = match parts.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.clone(),
    }
    .parse()
    .unwrap_or_else(|_| axum::http::Uri::from_static("/"));
    // Function URLs have no routes and so no path parameters: the function reads the path.
    let event =
        event("$default", &parts.method, &uri, &parts.headers, &BTreeMap::new(), None, &body);
    let lambda_request: LambdaRequest = match serde_json::from_value(event) {
        Ok(request) => request,
        Err(_) => return to_axum(gateway_error(500, "Internal Server Error")),
    };
    function.serve_stream(lambda_request.into()).await
}

/// An API request, with the HTTP API's CORS configuration applied as API Gateway applies it:
/// a preflight (`OPTIONS` with `Access-Control-Request-Method`) is answered `204` before any
/// route or authorizer, and an allowed origin's answer carries `Access-Control-Allow-Origin`
/// and `Access-Control-Expose-Headers`.
async fn serve(State(state): State<ApiState>, request: Request) -> Response {
    let Some(cors) = state.cors.clone() else { return serve_api(State(state), request).await };
    let origin = request.headers().get("origin").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let allowed = origin.as_deref().and_then(|o| cors.allow_origin(o));
    let preflight = request.method() == axum::http::Method::OPTIONS
        && request.headers().contains_key("access-control-request-method");
    let mut response = if preflight {
        StatusCode::NO_CONTENT.into_response()
    } else {
        serve_api(State(state), request).await
    };
    if let Some(allowed) = allowed {
        let headers = response.headers_mut();
        let mut set = |name: &'static str, value: String| {
            if let Ok(value) = value.parse() {
                headers.insert(name, value);
            }
        };
        set("access-control-allow-origin", allowed);
        set("vary", "Origin".into());
        if preflight {
            set("access-control-allow-methods", cors.allow_methods.join(","));
            set("access-control-allow-headers", cors.allow_headers.join(","));
            if let Some(max_age) = cors.max_age {
                set("access-control-max-age", max_age.to_string());
            }
        } else if !cors.expose_headers.is_empty() {
            set("access-control-expose-headers", cors.expose_headers.join(","));
        }
    }
    response
}

async fn serve_api(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let method = parts.method.as_str().to_owned();
    let path = parts.uri.path().to_owned();
    let Some((route, params)) =
        state.routes.iter().find_map(|r| r.matches(&method, &path).map(|p| (r, p)))
    else {
        return to_axum(gateway_error(404, "Not Found"));
    };
    let claims = if route.authorized {
        let header = parts.headers.get("authorization").and_then(|v| v.to_str().ok());
        match state.authorizer.authorize(header) {
            Some(claims) => Some(claims),
            None => return to_axum(gateway_error(401, "Unauthorized")),
        }
    } else {
        None
    };
    let body = match axum::body::to_bytes(body, MAX_PAYLOAD_BYTES).await {
        Ok(body) => body,
        Err(_) => return to_axum(gateway_error(413, "Request Entity Too Large")),
    };
    let route_key = format!("{} {}", route.method, route.path);
    let event =
        event(&route_key, &parts.method, &parts.uri, &parts.headers, &params, claims, &body);
    let lambda_request: LambdaRequest = match serde_json::from_value(event) {
        Ok(request) => request,
        Err(err) => {
            tracing::error!(error = %err, "building the API Gateway event failed");
            return to_axum(gateway_error(500, "Internal Server Error"));
        }
    };
    to_axum(route.function.serve(lambda_request.into()).await)
}

/// The payload 2.0 event API Gateway sends for this request.
fn event(
    route_key: &str,
    method: &axum::http::Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    params: &BTreeMap<String, String>,
    claims: Option<std::collections::HashMap<String, String>>,
    body: &[u8],
) -> Value {
    let mut header_map = serde_json::Map::new();
    let mut cookies = Vec::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        if name == "cookie" {
            cookies.extend(value.split("; ").map(str::to_owned));
            continue;
        }
        match header_map.get_mut(name.as_str()) {
            Some(Value::String(existing)) => {
                existing.push(',');
                existing.push_str(&value);
            }
            _ => {
                header_map.insert(name.as_str().to_owned(), Value::String(value));
            }
        }
    }
    let raw_query = uri.query().unwrap_or_default().to_owned();
    let mut query = serde_json::Map::new();
    for pair in raw_query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(&k.replace('+', " ")).unwrap_or_else(|| k.to_owned());
        let v = percent_decode(&v.replace('+', " ")).unwrap_or_else(|| v.to_owned());
        match query.get_mut(&k) {
            Some(Value::String(existing)) => {
                existing.push(',');
                existing.push_str(&v);
            }
            _ => {
                query.insert(k, Value::String(v));
            }
        }
    }
    let (body, base64) = match std::str::from_utf8(body) {
        Ok(text) => (text.to_owned(), false),
        Err(_) => {
            use base64::Engine;
            (base64::engine::general_purpose::STANDARD.encode(body), true)
        }
    };
    let now = chrono::Utc::now();
    json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": uri.path(),
        "rawQueryString": raw_query,
        "cookies": if cookies.is_empty() { Value::Null } else { json!(cookies) },
        "headers": header_map,
        "queryStringParameters": if query.is_empty() { Value::Null } else { Value::Object(query) },
        "pathParameters": if params.is_empty() { Value::Null } else { json!(params) },
        "requestContext": {
            "accountId": crate::stack::template::ACCOUNT,
            "apiId": "local",
            "authorizer": claims.map(|claims| json!({"jwt": {"claims": claims, "scopes": null}})),
            "domainName": headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1"),
            "domainPrefix": "local",
            "http": {
                "method": method.as_str(),
                "path": uri.path(),
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": headers.get("user-agent").and_then(|h| h.to_str().ok()).unwrap_or(""),
            },
            "requestId": uuid::Uuid::new_v4().to_string(),
            "routeKey": route_key,
            "stage": "$default",
            "time": now.format("%d/%b/%Y:%H:%M:%S %z").to_string(),
            "timeEpoch": now.timestamp_millis(),
        },
        "body": if body.is_empty() { Value::Null } else { Value::String(body) },
        "isBase64Encoded": base64,
    })
}

fn to_axum(response: lambda_http::Response<lambda_http::Body>) -> Response {
    let (parts, body) = response.into_parts();
    let bytes: Vec<u8> = match body {
        lambda_http::Body::Empty => Vec::new(),
        lambda_http::Body::Text(text) => text.into_bytes(),
        lambda_http::Body::Binary(bytes) => bytes,
        _ => Vec::new(),
    };
    Response::from_parts(parts, Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%"), None);
    }
}
