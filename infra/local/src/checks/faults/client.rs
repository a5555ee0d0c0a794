//! The SDK HTTP client of the hosted functions, which crashes and pauses invocations as the
//! plan says and tags every call with its function, invocation and lease.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

use super::invocation::INVOCATION;
use super::{Crash, FUNCTION_HEADER, Faults, INVOCATION_HEADER, Invocation, LEASE_HEADER};

/// The SDK HTTP client of the hosted functions: the real client, with crashes injected
/// around the calls of invocations the plan targets, each call tagged with the function and
/// the lease of the attempt making it, and each invocation's AWS time measured.
#[derive(Debug, Clone)]
pub struct FaultyHttpClient {
    inner: SharedHttpClient,
    faults: Arc<Faults>,
}

impl FaultyHttpClient {
    /// Wraps `inner`.
    pub fn new(inner: SharedHttpClient, faults: Arc<Faults>) -> Self {
        FaultyHttpClient { inner, faults }
    }
}

impl HttpClient for FaultyHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(FaultyConnector {
            inner: self.inner.http_connector(settings, components),
            faults: self.faults.clone(),
        })
    }
}

#[derive(Debug)]
struct FaultyConnector {
    inner: SharedHttpConnector,
    faults: Arc<Faults>,
}

impl HttpConnector for FaultyConnector {
    fn call(&self, mut request: HttpRequest) -> HttpConnectorFuture {
        // The SDK calls the connector from the task that awaits the operation, so the
        // task-local names the invocation (calls from tasks a handler spawns are not
        // attributed, and never crash).
        let Ok(invocation) = INVOCATION.try_with(Invocation::clone) else {
            return self.inner.call(request);
        };
        // Added after signing, so not part of the signature; the edge reads and drops them.
        let lease = invocation.lease.clone().or_else(|| {
            let job_id = invocation.job_id.as_deref()?;
            self.faults.claimed_lease(invocation.id, job_id)
        });
        let holds_lease = lease.is_some();
        if let Some(lease) = lease {
            request.headers_mut().insert(LEASE_HEADER, lease);
        }
        request.headers_mut().insert(FUNCTION_HEADER, invocation.function.clone());
        request.headers_mut().insert(INVOCATION_HEADER, invocation.id.to_string());
        let operation = operation_of(&request);
        let targeted = self.faults.crash_targets(&operation, request.uri(), request.body().bytes());
        match targeted.then(|| self.faults.crash_at_call(&invocation, &operation)).flatten() {
            None => {
                let aimed =
                    self.faults.pause_targets(&operation, request.uri(), request.body().bytes());
                let pause = aimed
                    .then(|| self.faults.pause_at_call(&invocation, &operation, holds_lease))
                    .flatten();
                let (inner, faults) = (self.inner.clone(), self.faults.clone());
                HttpConnectorFuture::new(async move {
                    // Counts the pause over however this future ends (answered or dropped).
                    let _pause_over = pause.map(|_| PauseOver(faults));
                    if let Some(pause) = pause {
                        tracing::info!(
                            function = invocation.function,
                            job_id = invocation.job_id,
                            ?pause,
                            "invocation paused (fault injected)"
                        );
                        tokio::time::sleep(pause).await;
                    }
                    let started = std::time::Instant::now();
                    let answer = inner.call(request).await;
                    invocation.count_call(started.elapsed());
                    answer
                })
            }
            Some(Crash::BeforeCall) => {
                invocation.crash();
                HttpConnectorFuture::new(std::future::pending())
            }
            Some(Crash::AfterCall) => {
                let call = self.inner.call(request);
                HttpConnectorFuture::new(async move {
                    // Whatever the answer, the function never sees it.
                    let _answer_never_seen = call.await;
                    invocation.crash();
                    std::future::pending().await
                })
            }
        }
    }
}

/// Counts a pause over when dropped.
struct PauseOver(Arc<Faults>);

impl Drop for PauseOver {
    fn drop(&mut self) {
        self.0.pauses_over.fetch_add(1, Ordering::Relaxed);
    }
}

/// Names a signed SDK request `service:Operation`, as the edge does.
fn operation_of(request: &HttpRequest) -> String {
    let mut headers = axum::http::HeaderMap::new();
    for name in ["authorization", "x-amz-target", "x-amz-copy-source"] {
        if let Some(value) =
            request.headers().get(name).and_then(|v| axum::http::HeaderValue::from_str(v).ok())
        {
            headers.insert(name, value);
        }
    }
    let method = axum::http::Method::from_bytes(request.method().as_bytes()).unwrap_or_default();
    let uri = request.uri().parse::<axum::http::Uri>().unwrap_or_default();
    crate::hosting::operations::classify(&method, &uri, &headers)
}
