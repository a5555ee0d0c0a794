//! Hosting the functions in-process: the same handlers the Lambda binaries run, built from
//! the same typed configuration, invoked with the same event JSON.
//!
//! This is the one place that knows how each function's handler is hosted. A function added to
//! the template is a new `longhaul_lambda::Function`, whose match arm here the compiler asks
//! for; the stack refuses to start if a template function names no function, rather than
//! skipping it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use aws_config::SdkConfig;
use futures::FutureExt;
use futures::future::BoxFuture;
use lambda_http::{Body, Request, Response};
use lambda_runtime::Diagnostic;
use longhaul_aws::config::Vars;
use longhaul_worker::Registry;
use serde_json::Value;

use crate::checks::faults::Invocation;
use crate::stack::model::FunctionSpec;
use longhaul_lambda::Function;

type HttpHandler = Arc<dyn Fn(Request) -> BoxFuture<'static, Response<Body>> + Send + Sync>;
type StreamHandler =
    Arc<dyn Fn(Request) -> BoxFuture<'static, Response<axum::body::Body>> + Send + Sync>;
type EventHandler =
    Arc<dyn Fn(Value, Instant) -> BoxFuture<'static, Result<Value, Diagnostic>> + Send + Sync>;

/// A function's handler.
#[derive(Clone)]
pub enum Handler {
    /// An API function (lambda_http).
    Http(HttpHandler),
    /// Any other function: JSON event in, JSON out (lambda_runtime).
    Event(EventHandler),
    /// A function URL in RESPONSE_STREAM mode: the body is streamed as it is produced.
    Stream(StreamHandler),
}

/// An invocation in flight: the job it works on (if its event names one) and its task.
type Inflight = (Option<String>, tokio::task::AbortHandle);

/// One finished invocation of a hosted function (`GET /_local/invocations`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InvocationRecord {
    /// The function's logical name.
    pub function: String,
    /// The job its event named, if any.
    pub job_id: Option<String>,
    /// Wall time of the handler, milliseconds.
    pub duration_ms: f64,
    /// Of which waiting for AWS calls, milliseconds.
    pub aws_ms: f64,
    /// AWS calls it made.
    pub aws_calls: u32,
    /// `ok`, `error` (a function error), `crashed`, `panicked` or `timed_out`.
    pub outcome: String,
}

/// The most recent invocations of every hosted function (at most [`InvocationLog::CAPACITY`]).
#[derive(Debug, Clone, Default)]
pub struct InvocationLog(Arc<std::sync::Mutex<std::collections::VecDeque<InvocationRecord>>>);

impl InvocationLog {
    /// Records kept; the oldest go first.
    pub const CAPACITY: usize = 200_000;

    fn record(&self, invocation: &Invocation, started: Instant, outcome: &str) {
        let aws = invocation.aws_use();
        let mut log = self.0.lock().expect("invocation log");
        if log.len() == Self::CAPACITY {
            log.pop_front();
        }
        log.push_back(InvocationRecord {
            function: invocation.function.clone(),
            job_id: invocation.job_id.clone(),
            duration_ms: started.elapsed().as_secs_f64() * 1e3,
            aws_ms: aws.time.as_secs_f64() * 1e3,
            aws_calls: aws.calls,
            outcome: outcome.to_owned(),
        });
    }

    /// The records so far, oldest first.
    pub fn snapshot(&self) -> Vec<InvocationRecord> {
        self.0.lock().expect("invocation log").iter().cloned().collect()
    }
}

/// A hosted function.
#[derive(Clone)]
pub struct HostedFunction {
    /// Its template description.
    pub spec: FunctionSpec,
    /// Its handler.
    pub handler: Handler,
    /// What its init warms, as the deployed function's does (`Deps::warm_set`): the stack runs
    /// these under the function's identity at start, so a warm-up its role does not allow fails
    /// the start (see `LocalStack::start`).
    pub warm_set: Vec<Arc<dyn longhaul_aws::ports::Warm>>,
    /// Invocations in flight, so a test can crash them (`POST /_local/functions/{name}/crash`).
    inflight: Arc<std::sync::Mutex<Vec<Inflight>>>,
    /// Where finished invocations are recorded.
    log: InvocationLog,
    /// Jobs whose asynchronous event Lambda is to lose at its next failure (a test's "the
    /// worker dies for good": [`HostedFunction::crash_for_good`]).
    lost_events: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

fn typed<I, O, E, F, Fut>(handler: F) -> EventHandler
where
    I: serde::de::DeserializeOwned + Send + 'static,
    O: serde::Serialize,
    E: Into<Diagnostic>,
    F: Fn(I, Instant) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
{
    let handler = Arc::new(handler);
    Arc::new(move |event: Value, deadline: Instant| {
        let handler = handler.clone();
        async move {
            let input: I = serde_json::from_value(event).map_err(|e| Diagnostic {
                error_type: "Runtime.UnmarshalError".into(),
                error_message: e.to_string(),
            })?;
            let output = handler(input, deadline).await.map_err(Into::into)?;
            Ok(serde_json::to_value(output).expect("outputs serialise"))
        }
        .boxed()
    })
}

fn http<F, Fut>(handler: F) -> Handler
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    Handler::Http(Arc::new(move |request| handler(request).boxed()))
}

/// An API function: its crate has `Config::from_vars`, `Deps::new` and `handle`.
macro_rules! http_function {
    ($krate:ident, $vars:expr, $sdk:expr, $context:expr, $warm:ident) => {{
        let deps = Arc::new($krate::Deps::new(
            $sdk,
            &$krate::Config::from_vars($vars).with_context($context)?,
        ));
        $warm = deps.warm_set();
        http(move |request| {
            let deps = deps.clone();
            async move { $krate::handle(&deps, request).await }
        })
    }};
}

/// An API function that knows the job kinds (submit, status): as [`http_function!`], with
/// `ENABLED_JOB_TYPES` checked against `registry` rather than the catalog its own
/// `Config::from_vars` knows, and its `Deps` holding `registry`'s enabled kinds.
macro_rules! http_function_with_kinds {
    ($krate:ident, $spec:expr, $sdk:expr, $context:expr, $registry:expr, $warm:ident) => {{
        let (vars, enabled) = split_enabled_job_types($spec, $registry).with_context($context)?;
        let mut config = $krate::Config::from_vars(&vars).with_context($context)?;
        config.enabled_job_types = enabled;
        let mut deps = $krate::Deps::new($sdk, &config);
        deps.registry = $registry.enabled(&config.enabled_job_types);
        $warm = deps.warm_set();
        let deps = Arc::new(deps);
        http(move |request| {
            let deps = deps.clone();
            async move { $krate::handle(&deps, request).await }
        })
    }};
}

/// `spec`'s environment without `ENABLED_JOB_TYPES` (so the function's own configuration
/// does not check it against the catalog), and that list checked against `registry` (unset:
/// every kind it registers).
fn split_enabled_job_types(
    spec: &FunctionSpec,
    registry: &Registry,
) -> anyhow::Result<(Vars, Vec<String>)> {
    let mut env: std::collections::HashMap<String, String> = spec.env.clone().into_iter().collect();
    let list = env.remove("ENABLED_JOB_TYPES");
    let enabled = registry.enabled_names(list.as_deref()).context("ENABLED_JOB_TYPES")?;
    Ok((Vars::from_map(env), enabled))
}

/// Builds the handler for `spec`, with its environment (plus `overrides`); the functions that
/// know job kinds know `registry`'s.
pub fn host(
    spec: &FunctionSpec,
    sdk: &SdkConfig,
    log: &InvocationLog,
    registry: &Registry,
) -> anyhow::Result<HostedFunction> {
    let vars = Vars::from_map(spec.env.clone().into_iter().collect());
    let context = || format!("configuring {} ({})", spec.logical, spec.function);
    // Reaper, expirer, slots and the schedule repair warm nothing (`lambda.rs`).
    let mut warm_set = Vec::new();
    let handler = match spec.function {
        Function::Submit => {
            http_function_with_kinds!(submit, spec, sdk, context, registry, warm_set)
        }
        Function::Status => {
            http_function_with_kinds!(status, spec, sdk, context, registry, warm_set)
        }
        Function::Cancel => http_function!(cancel, &vars, sdk, context, warm_set),
        Function::Uploads => http_function!(uploads, &vars, sdk, context, warm_set),
        Function::Webhooks => http_function!(webhooks, &vars, sdk, context, warm_set),
        // The web console: static files, no configuration, no AWS call.
        Function::Console => http(|request| async move { console::handle(&request) }),
        Function::Events => {
            let deps = Arc::new(events::Deps::new(
                sdk,
                &events::Config::from_vars(&vars).with_context(context)?,
            ));
            warm_set = deps.warm_set();
            Handler::Stream(Arc::new(move |request| {
                let deps = deps.clone();
                async move {
                    let response = events::handle(deps, request).await;
                    let (parts, body) = response.into_parts();
                    Response::from_parts(parts, axum::body::Body::new(body))
                }
                .boxed()
            }))
        }
        Function::Webhook => {
            let config = webhook::Config::from_vars(&vars).with_context(context)?;
            let deps = Arc::new(
                webhook::Deps::new(sdk, &config, Arc::new(webhook::SystemResolver))
                    .with_context(context)?,
            );
            warm_set = deps.warm_set();
            Handler::Event(typed(move |event: aws_lambda_events::sqs::SqsEvent, _deadline| {
                let deps = deps.clone();
                async move { Ok::<_, Diagnostic>(webhook::handle(&deps, event).await) }
            }))
        }
        Function::Notifier => {
            let deps = Arc::new(notifier::Deps::new(
                sdk,
                &notifier::Config::from_vars(&vars).with_context(context)?,
            ));
            warm_set = deps.warm_set();
            Handler::Event(typed(move |event: aws_lambda_events::dynamodb::Event, _deadline| {
                let deps = deps.clone();
                async move { Ok::<_, Diagnostic>(notifier::handle(&deps, event).await) }
            }))
        }
        Function::Slots => {
            let deps = Arc::new(slots::Deps::new(
                sdk,
                &slots::Config::from_vars(&vars).with_context(context)?,
            ));
            Handler::Event(typed(move |event: aws_lambda_events::dynamodb::Event, _deadline| {
                let deps = deps.clone();
                async move { Ok::<_, Diagnostic>(slots::handle(&deps, event).await) }
            }))
        }
        Function::Dispatcher => {
            let deps = Arc::new(dispatcher::Deps::new(
                sdk,
                &dispatcher::Config::from_vars(&vars).with_context(context)?,
            ));
            warm_set = deps.warm_set();
            Handler::Event(typed(move |event: aws_lambda_events::sqs::SqsEvent, _deadline| {
                let deps = deps.clone();
                async move { Ok::<_, Diagnostic>(dispatcher::handle(&deps, event).await) }
            }))
        }
        Function::Stage => {
            let mut deps =
                stage::Deps::new(sdk, &stage::Config::from_vars(&vars).with_context(context)?);
            deps.registry = registry.clone();
            warm_set = deps.warm_set();
            let deps = Arc::new(deps);
            Handler::Event(typed(move |input: stage::StageInput, deadline| {
                let deps = deps.clone();
                async move { stage::handle(&deps, input, deadline).await }
            }))
        }
        Function::Reaper => {
            let deps = Arc::new(reaper::Deps::new(
                sdk,
                &reaper::Config::from_vars(&vars).with_context(context)?,
            ));
            Handler::Event(typed(move |_event: Value, _deadline| {
                let deps = deps.clone();
                async move { reaper::handle(&deps, deps.clock.now()).await }
            }))
        }
        Function::Schedules => {
            let (vars, enabled) = split_enabled_job_types(spec, registry).with_context(context)?;
            let mut config = schedules::Config::from_vars(&vars).with_context(context)?;
            config.submit.enabled_job_types = enabled;
            let mut deps = schedules::Deps::new(sdk, &config);
            deps.registry = registry.enabled(&config.submit.enabled_job_types);
            warm_set = deps.warm_set();
            let deps = Arc::new(deps);
            http(move |request| {
                let deps = deps.clone();
                async move { schedules::handle(&deps, request).await }
            })
        }
        Function::Firing => {
            let (vars, enabled) = split_enabled_job_types(spec, registry).with_context(context)?;
            let mut config = schedules::fire::FireConfig::from_vars(&vars).with_context(context)?;
            config.submit.enabled_job_types = enabled;
            let mut deps = schedules::fire::FireDeps::new(sdk, &config);
            deps.submit.registry = registry.enabled(&config.submit.enabled_job_types);
            warm_set = deps.warm_set();
            let deps = Arc::new(deps);
            Handler::Event(typed(move |event: aws_lambda_events::sqs::SqsEvent, _deadline| {
                let deps = deps.clone();
                async move { Ok::<_, Diagnostic>(schedules::fire::handle(&deps, event).await) }
            }))
        }
        Function::ScheduleRepair => {
            let config = schedules::repair::RepairConfig::from_vars(&vars).with_context(context)?;
            let deps = Arc::new(schedules::repair::RepairDeps::new(sdk, &config));
            Handler::Event(typed(move |_event: Value, _deadline| {
                let deps = deps.clone();
                async move { Ok::<_, Diagnostic>(schedules::repair::repair(&deps).await) }
            }))
        }
        Function::Expirer => {
            let deps = Arc::new(expirer::Deps::new(
                sdk,
                &expirer::Config::from_vars(&vars).with_context(context)?,
            ));
            Handler::Event(typed(move |_event: Value, deadline| {
                let deps = deps.clone();
                async move { expirer::run(&deps, deadline).await }
            }))
        }
    };
    Ok(HostedFunction {
        spec: spec.clone(),
        handler,
        warm_set,
        inflight: Default::default(),
        log: log.clone(),
        lost_events: Default::default(),
    })
}

impl HostedFunction {
    /// Invokes an event function as Lambda would: within its timeout, a panic or a timeout
    /// becoming an error result rather than taking the host down.
    pub async fn invoke(&self, event: Value) -> Result<Value, Diagnostic> {
        let Handler::Event(handler) = &self.handler else {
            return Err(Diagnostic {
                error_type: "Runtime.InvalidInvocation".into(),
                error_message: format!("{} is an HTTP API function", self.spec.logical),
            });
        };
        let timeout = self.spec.timeout;
        let invocation = Invocation::new(&self.spec.logical, Some(&event));
        let started = Instant::now();
        // The timeout is inside the task: Lambda stops a timed-out invocation's code (it
        // resets the sandbox), so nothing of it may go on writing after its caller was told.
        let mut task = tokio::spawn(
            invocation
                .scope(tokio::time::timeout(timeout, handler(event, Instant::now() + timeout))),
        );
        let abort = task.abort_handle();
        self.inflight
            .lock()
            .expect("inflight lock")
            .push((invocation.job_id.clone(), abort.clone()));
        let outcome = tokio::select! {
            outcome = &mut task => outcome,
            () = invocation.crashed() => {
                // A fault plan crashed it at an AWS call: the sandbox dies there.
                abort.abort();
                task.await
            }
        };
        self.inflight.lock().expect("inflight lock").retain(|(_, h)| !h.is_finished());
        let kind = match &outcome {
            Ok(Ok(Ok(_))) => "ok",
            Ok(Ok(Err(_))) => "error",
            Ok(Err(_elapsed)) => "timed_out",
            Err(join_error) if join_error.is_cancelled() => "crashed",
            Err(_) => "panicked",
        };
        self.log.record(&invocation, started, kind);
        match outcome {
            Ok(Ok(result)) => result,
            // What Lambda reports when the runtime process dies mid-invocation.
            Err(join_error) if join_error.is_cancelled() => Err(Diagnostic {
                error_type: "Runtime.ExitError".into(),
                error_message: format!(
                    "{}: the runtime exited (crash injected)",
                    self.spec.logical
                ),
            }),
            Err(join_error) => Err(Diagnostic {
                error_type: "Runtime.Panic".into(),
                error_message: format!("{} panicked: {join_error}", self.spec.logical),
            }),
            Ok(Err(_elapsed)) => Err(Diagnostic {
                error_type: "Sandbox.Timedout".into(),
                error_message: format!("Task timed out after {:.2} seconds", timeout.as_secs_f64()),
            }),
        }
    }

    /// [`Self::crash`]es `job_id`'s invocations and has Lambda lose the asynchronous event of
    /// the one that crashes (no retry, no on-failure destination: Lambda documents that it
    /// may drop events), so the job's worker is gone for good — what the reaper is there for.
    pub fn crash_for_good(&self, job_id: &str) -> usize {
        self.lost_events.lock().expect("lost events lock").insert(job_id.to_owned());
        self.crash(Some(job_id))
    }

    /// Whether Lambda is to lose the asynchronous event `event` after its failure (once).
    pub fn loses_event(&self, event: &Value) -> bool {
        let job_id = event["job_id"].as_str().unwrap_or_default();
        self.lost_events.lock().expect("lost events lock").remove(job_id)
    }

    /// Kills the invocations in flight (those for `job_id` only, when given), as a crash of
    /// the function's sandbox would; returns how many there were. The work they did since
    /// their last checkpoint is lost.
    pub fn crash(&self, job_id: Option<&str>) -> usize {
        let mut inflight = self.inflight.lock().expect("inflight lock");
        let mut crashed = 0;
        inflight.retain(|(job, handle)| {
            let hit = job_id.is_none() || job.as_deref() == job_id;
            if hit {
                handle.abort();
                crashed += 1;
            }
            !hit
        });
        crashed
    }

    /// Serves one streaming function-URL request (no timeout here: the stream ends itself).
    pub async fn serve_stream(&self, request: Request) -> Response<axum::body::Body> {
        match &self.handler {
            // Scoped as an invocation so the edge attributes the function's calls to it in
            // `/_local/aws-calls/by-function` (those made opening the stream; the body's later
            // polls run outside the scope and count only in the totals).
            Handler::Stream(handler) => {
                Invocation::new(&self.spec.logical, None).scope(handler(request)).await
            }
            _ => {
                let (parts, body) = gateway_error(500, "Internal Server Error").into_parts();
                Response::from_parts(parts, axum::body::Body::from(body.as_ref().to_vec()))
            }
        }
    }

    /// Serves one HTTP API request, within the function's timeout (API Gateway answers 503
    /// when the integration times out; HTTP APIs cap it at 30 s).
    pub async fn serve(&self, request: Request) -> Response<Body> {
        let Handler::Http(handler) = &self.handler else {
            return gateway_error(500, "Internal Server Error");
        };
        let gateway_timeout = self.spec.timeout.min(Duration::from_secs(30));
        // What of the request the fault plan reads: the key a client retries a submission with.
        let key = request.headers().get("idempotency-key").and_then(|v| v.to_str().ok());
        let invocation = Invocation::new(
            &self.spec.logical,
            Some(&serde_json::json!({"headers": {"idempotency-key": key}})),
        );
        let started = Instant::now();
        // The function runs until its own timeout even when the gateway gave up sooner, as on
        // AWS; then Lambda stops it.
        let mut task = tokio::spawn(
            invocation.scope(tokio::time::timeout(self.spec.timeout, handler(request))),
        );
        let (kind, response) = tokio::select! {
            outcome = tokio::time::timeout(gateway_timeout, &mut task) => match outcome {
                Ok(Ok(Ok(response))) => ("ok", response),
                Ok(Err(_panic)) => ("panicked", gateway_error(500, "Internal Server Error")),
                Ok(Ok(Err(_))) | Err(_) => ("timed_out", gateway_error(503, "Service Unavailable")),
            },
            () = invocation.crashed() => {
                // What API Gateway answers when the function's runtime dies mid-request.
                task.abort();
                ("crashed", gateway_error(502, "Internal Server Error"))
            }
        };
        self.log.record(&invocation, started, kind);
        response
    }
}

/// A response produced by the gateway itself, shaped as API Gateway shapes it.
pub fn gateway_error(status: u16, message: &str) -> Response<Body> {
    let mut response =
        Response::new(Body::from(serde_json::json!({ "message": message }).to_string()));
    *response.status_mut() = lambda_http::http::StatusCode::from_u16(status).expect("valid status");
    response
        .headers_mut()
        .insert("content-type", lambda_http::http::HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Sends on drop: tells the test the handler's future is gone (finished or stopped).
    struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                tx.send(()).ok(); // the test may have given up already
            }
        }
    }

    fn function(timeout: Duration, handler: Handler) -> HostedFunction {
        let spec = FunctionSpec {
            logical: "SlowFunction".into(),
            name: "longhaul-SlowFunction".into(),
            function: Function::Reaper,
            timeout,
            env: Default::default(),
            events: Vec::new(),
            async_invoke: Default::default(),
        };
        HostedFunction {
            spec,
            handler,
            warm_set: Vec::new(),
            inflight: Default::default(),
            log: InvocationLog::default(),
            lost_events: Default::default(),
        }
    }

    /// Lambda stops a timed-out invocation (it resets the sandbox): what its code would have
    /// done after the timeout never happens, e.g. a late write racing the retry of the event.
    #[tokio::test]
    async fn a_timed_out_invocation_is_stopped_not_left_running() {
        let wrote = Arc::new(AtomicBool::new(false));
        let (gone_tx, gone) = tokio::sync::oneshot::channel();
        let gone_tx = Arc::new(std::sync::Mutex::new(Some(gone_tx)));
        let flag = wrote.clone();
        let handler = Handler::Event(Arc::new(move |_event, _deadline| {
            let (flag, guard) = (flag.clone(), Dropped(gone_tx.lock().unwrap().take()));
            async move {
                let _guard = guard;
                // Far past the timeout, so that however late the test's thread is polled,
                // the timeout is what is due first.
                tokio::time::sleep(Duration::from_secs(60)).await;
                flag.store(true, Ordering::SeqCst);
                Ok(Value::Null)
            }
            .boxed()
        }));
        let slow = function(Duration::from_millis(50), handler);

        let error = slow.invoke(serde_json::json!({"job_id": "j1"})).await.unwrap_err();
        assert_eq!(error.error_type, "Sandbox.Timedout");
        assert_eq!(error.error_message, "Task timed out after 0.05 seconds");
        gone.await.expect("the handler's future is dropped");
        assert!(
            !wrote.load(Ordering::SeqCst),
            "the timed-out code ran on after its caller was told"
        );
        let log = slow.log.snapshot();
        assert_eq!(
            (log.len(), log[0].outcome.as_str(), log[0].job_id.as_deref()),
            (1, "timed_out", Some("j1"))
        );
    }
}
