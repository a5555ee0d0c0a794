//! The endpoint routes over the in-memory adapters: creating, reading, listing, changing,
//! deleting and enabling endpoints, each refusal (which writes nothing), the cap, other
//! owners' ids, and a change that loses races.

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use lambda_http::Body;
use longhaul_aws::jobs::{EndpointRecord, StoreError};
use longhaul_aws::ports::{Clock, EndpointHealth, EndpointStore, Warm};
use longhaul_domain::endpoints::{DisabledReason, EndpointId};
use longhaul_domain::{Owner, Timestamp};
use longhaul_memory::api::{ApiRequest, json_of};
use longhaul_memory::{MemoryEndpoints, owner};
use serde_json::{Value, json};

use crate::tests::{World, world};
use crate::{Deps, handle};

/// A public address: nothing is looked up for an IP literal.
pub(crate) const URL: &str = "https://93.184.215.14/hook";

pub(crate) fn spec() -> Value {
    json!({"url": URL, "events": ["job.succeeded", "job.failed"], "description": "partner"})
}

/// `method path` as `who` (the route key API Gateway would match, the endpoint id if the
/// route has one), with `body` as JSON if given.
pub(crate) async fn call(
    deps: &Deps,
    who: &str,
    route: &str,
    endpoint: Option<&str>,
    body: Option<&Value>,
) -> lambda_http::Response<Body> {
    let (method, template) = route.split_once(' ').expect("a route key");
    let path = template.replace("{endpoint_id}", endpoint.unwrap_or("-"));
    let mut request = ApiRequest::new(method, &path, who).route(route);
    if let Some(id) = endpoint {
        request = request.param("endpoint_id", id);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    handle(deps, request.build()).await
}

/// Creates an endpoint of `who` from `body`; its id (asserting 201).
pub(crate) async fn created(deps: &Deps, who: &str, body: &Value) -> String {
    let response = call(deps, who, "POST /webhooks/endpoints", None, Some(body)).await;
    assert_eq!(response.status(), 201, "{:?}", json_of(&response));
    json_of(&response)["endpoint_id"].as_str().unwrap().to_owned()
}

/// Asserts `response` is a problem of `status` and type `/problems/<kind>`; the problem.
pub(crate) fn problem(response: &lambda_http::Response<Body>, status: u16, kind: &str) -> Value {
    assert_eq!(response.status(), status, "{:?}", String::from_utf8_lossy(response.body()));
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let problem = json_of(response);
    assert_eq!(problem["type"], format!("/problems/{kind}"), "{problem}");
    problem
}

async fn stored(w: &World, who: &str) -> Vec<EndpointRecord> {
    w.endpoints.endpoints(&owner(who)).await.unwrap()
}

#[tokio::test]
async fn an_endpoint_is_created_shown_and_listed_to_its_owner_only() {
    let w = world();
    let body = json!({"url": URL, "events": ["job.succeeded", "job.progress", "job.cancelled", "job.failed"]});
    let response = call(&w.deps, "alice", "POST /webhooks/endpoints", None, Some(&body)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["cache-control"], "no-store");
    let view = json_of(&response);
    let id = view["endpoint_id"].as_str().unwrap();
    assert!(id.parse::<EndpointId>().is_ok(), "{id}");
    assert_eq!(response.headers()["location"], format!("/webhooks/endpoints/{id}"));
    assert_eq!(
        view["events"],
        json!(["job.cancelled", "job.failed", "job.progress", "job.succeeded"]),
        "sorted by name"
    );
    assert_eq!(view["url"], URL);
    assert_eq!(view["status"], "enabled");
    assert_eq!(view["created_at"], view["updated_at"]);
    let members: Vec<&str> = view.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        members.iter().copied().collect::<std::collections::BTreeSet<_>>(),
        ["created_at", "endpoint_id", "events", "status", "updated_at", "url"].into(),
        "no owner, nothing unset: {view}"
    );

    let read =
        call(&w.deps, "alice", "GET /webhooks/endpoints/{endpoint_id}", Some(id), None).await;
    assert_eq!((read.status(), json_of(&read)), (lambda_http::http::StatusCode::OK, view.clone()));
    let described = created(&w.deps, "alice", &spec()).await;
    let list = call(&w.deps, "alice", "GET /webhooks/endpoints", None, None).await;
    assert_eq!(list.status(), 200);
    let listed = json_of(&list)["endpoints"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], view, "oldest first");
    assert_eq!(listed[1]["endpoint_id"], described.as_str());
    assert_eq!(listed[1]["description"], "partner");

    let theirs = call(&w.deps, "bob", "GET /webhooks/endpoints", None, None).await;
    assert_eq!(json_of(&theirs), json!({"endpoints": []}), "bob has none");
    for route in [
        "GET /webhooks/endpoints/{endpoint_id}",
        "DELETE /webhooks/endpoints/{endpoint_id}",
        "POST /webhooks/endpoints/{endpoint_id}/enable",
    ] {
        problem(&call(&w.deps, "bob", route, Some(id), None).await, 404, "not-found");
    }
    let patch = json!({"events": ["job.failed"]});
    let response =
        call(&w.deps, "bob", "PATCH /webhooks/endpoints/{endpoint_id}", Some(id), Some(&patch))
            .await;
    problem(&response, 404, "not-found");
    assert_eq!(stored(&w, "alice").await.len(), 2, "bob changed nothing of alice's");
    assert!(stored(&w, "alice").await.iter().any(|r| r.spec.events.len() == 4));
}

#[tokio::test]
async fn a_spec_that_is_not_acceptable_is_refused_and_nothing_is_created() {
    let w = world();
    let too_long = "d".repeat(257);
    for (body, says) in [
        (json!({"url": "http://93.184.215.14/hook", "events": ["job.failed"]}), "https"),
        (json!({"url": "https://10.0.0.1/hook", "events": ["job.failed"]}), "public"),
        (json!({"url": "https://169.254.169.254/latest", "events": ["job.failed"]}), "public"),
        (json!({"url": "https://localhost/hook", "events": ["job.failed"]}), "localhost"),
        (json!({"url": URL, "events": []}), "at least one"),
        (json!({"url": URL, "events": ["job.done"]}), "unknown event"),
        (json!({"url": URL}), "`events` is required"),
        (json!({"events": ["job.failed"]}), "`url` is required"),
        (json!({"url": URL, "events": ["job.failed"], "secret": "x"}), "`secret`"),
        (json!({"url": URL, "events": ["job.failed"], "description": too_long}), "256"),
        (json!([URL]), "JSON object"),
    ] {
        let response = call(&w.deps, "alice", "POST /webhooks/endpoints", None, Some(&body)).await;
        let problem = problem(&response, 422, "invalid-endpoint");
        assert!(problem["detail"].as_str().unwrap().contains(says), "{body}: {problem}");
    }
    // Not JSON, not declared JSON, too large.
    let request = |raw: &[u8], json: bool| {
        let request = ApiRequest::new("POST", "/webhooks/endpoints", "alice")
            .route("POST /webhooks/endpoints")
            .raw_body(raw);
        if json { request.header("content-type", "application/json") } else { request }
    };
    problem(&handle(&w.deps, request(b"{", true).build()).await, 400, "bad-request");
    let body = spec().to_string();
    let plain = handle(&w.deps, request(body.as_bytes(), false).build()).await;
    problem(&plain, 415, "unsupported-media-type");
    let huge = json!({"url": URL, "events": vec!["job.failed"; 2000]}).to_string();
    problem(
        &handle(&w.deps, request(huge.as_bytes(), true).build()).await,
        413,
        "payload-too-large",
    );
    assert!(stored(&w, "alice").await.is_empty(), "nothing was created");
}

/// The host is resolved when the endpoint is created: a name that does not resolve is
/// refused now rather than failing every delivery later.
#[tokio::test]
async fn a_host_that_does_not_resolve_is_refused() {
    let w = world();
    let body = json!({"url": "https://no-such-host.invalid/hook", "events": ["job.failed"]});
    let response = call(&w.deps, "alice", "POST /webhooks/endpoints", None, Some(&body)).await;
    let problem = problem(&response, 422, "invalid-endpoint");
    assert!(problem["detail"].as_str().unwrap().contains("does not resolve"), "{problem}");
    assert!(stored(&w, "alice").await.is_empty());
}

#[tokio::test]
async fn an_owner_at_the_cap_is_refused_until_one_is_deleted() {
    let mut w = world();
    w.deps.max_endpoints = 2;
    let first = created(&w.deps, "alice", &spec()).await;
    created(&w.deps, "alice", &spec()).await;
    let response = call(&w.deps, "alice", "POST /webhooks/endpoints", None, Some(&spec())).await;
    let refused = problem(&response, 409, "endpoint-limit");
    assert_eq!(refused["limit"], 2);
    assert_eq!(stored(&w, "alice").await.len(), 2, "nothing was created");
    created(&w.deps, "bob", &spec()).await;
    let deleted =
        call(&w.deps, "alice", "DELETE /webhooks/endpoints/{endpoint_id}", Some(&first), None)
            .await;
    assert_eq!(deleted.status(), 204);
    created(&w.deps, "alice", &spec()).await;
}

#[tokio::test]
async fn a_patch_replaces_what_it_names_and_keeps_the_rest() {
    let w = world();
    let id = created(&w.deps, "alice", &spec()).await;
    let before = stored(&w, "alice").await.remove(0);
    w.clock.advance(std::time::Duration::from_secs(60));
    let patch =
        json!({"events": ["job.cancelled"], "description": null, "url": "https://1.1.1.1/new"});
    let response =
        call(&w.deps, "alice", "PATCH /webhooks/endpoints/{endpoint_id}", Some(&id), Some(&patch))
            .await;
    assert_eq!(response.status(), 200);
    let view = json_of(&response);
    assert_eq!(view["events"], json!(["job.cancelled"]));
    assert_eq!(view["url"], "https://1.1.1.1/new");
    assert!(view.get("description").is_none(), "{view}");
    assert_eq!(view["created_at"], json!(before.created_at));
    assert_eq!(view["updated_at"], json!(Timestamp::from(w.clock.now())));
    let after = stored(&w, "alice").await.remove(0);
    assert_eq!(after.version, before.version + 1);
    assert_eq!(view, crate::view::endpoint(&after), "the answer is what is stored");

    // The same patch again changes nothing: no write, no new version.
    w.clock.advance(std::time::Duration::from_secs(60));
    let again =
        call(&w.deps, "alice", "PATCH /webhooks/endpoints/{endpoint_id}", Some(&id), Some(&patch))
            .await;
    assert_eq!(json_of(&again), view);
    assert_eq!(stored(&w, "alice").await.remove(0), after);

    for (patch, status, kind) in [
        (json!({"url": "https://10.1.2.3/x"}), 422, "invalid-endpoint"),
        (json!({"url": "https://no-such-host.invalid/x"}), 422, "invalid-endpoint"),
        (json!({"events": []}), 422, "invalid-endpoint"),
        (json!({"status": "disabled"}), 422, "invalid-endpoint"),
        (json!("events"), 422, "invalid-endpoint"),
    ] {
        let response = call(
            &w.deps,
            "alice",
            "PATCH /webhooks/endpoints/{endpoint_id}",
            Some(&id),
            Some(&patch),
        )
        .await;
        problem(&response, status, kind);
    }
    assert_eq!(stored(&w, "alice").await.remove(0), after, "no refused patch wrote anything");
}

#[tokio::test]
async fn malformed_ids_and_unknown_routes_are_404() {
    let w = world();
    let id = created(&w.deps, "alice", &spec()).await;
    for bad in ["x", "", &id.to_uppercase(), "00000000-0000-0000-0000-000000000000z"] {
        for route in [
            "GET /webhooks/endpoints/{endpoint_id}",
            "DELETE /webhooks/endpoints/{endpoint_id}",
            "POST /webhooks/endpoints/{endpoint_id}/enable",
        ] {
            problem(&call(&w.deps, "alice", route, Some(bad), None).await, 404, "not-found");
        }
    }
    let unknown = EndpointId::new().to_string();
    let response =
        call(&w.deps, "alice", "GET /webhooks/endpoints/{endpoint_id}", Some(&unknown), None).await;
    problem(&response, 404, "not-found");
    problem(&call(&w.deps, "alice", "PUT /webhooks/endpoints", None, None).await, 404, "not-found");
    let anonymous = ApiRequest::new("GET", "/webhooks/endpoints", "alice")
        .route("GET /webhooks/endpoints")
        .anonymous();
    assert_eq!(handle(&w.deps, anonymous.build()).await.status(), 401);
}

#[tokio::test]
async fn a_deleted_endpoint_is_gone() {
    let w = world();
    let id = created(&w.deps, "alice", &spec()).await;
    let route = "DELETE /webhooks/endpoints/{endpoint_id}";
    let response = call(&w.deps, "alice", route, Some(&id), None).await;
    assert_eq!(response.status(), 204);
    assert!(response.body().is_empty());
    problem(&call(&w.deps, "alice", route, Some(&id), None).await, 404, "not-found");
    let read = call(&w.deps, "alice", "GET /webhooks/endpoints/{endpoint_id}", Some(&id), None);
    problem(&read.await, 404, "not-found");
    assert!(stored(&w, "alice").await.is_empty());
}

#[tokio::test]
async fn enabling_a_disabled_endpoint_clears_its_disablement_and_an_enabled_one_is_untouched() {
    let w = world();
    let id = created(&w.deps, "alice", &spec()).await;
    let route = "POST /webhooks/endpoints/{endpoint_id}/enable";
    let before = stored(&w, "alice").await.remove(0);
    w.clock.advance(std::time::Duration::from_secs(60));
    let response = call(&w.deps, "alice", route, Some(&id), None).await;
    assert_eq!(response.status(), 200);
    assert_eq!(json_of(&response), crate::view::endpoint(&before));
    assert_eq!(stored(&w, "alice").await.remove(0), before, "nothing written");

    let endpoint: EndpointId = id.parse().unwrap();
    let at = Timestamp::from(w.clock.now());
    w.endpoints.mark_failing(&owner("alice"), &endpoint, at).await.unwrap();
    w.endpoints
        .disable_endpoint(&owner("alice"), &endpoint, DisabledReason::Gone, None, at)
        .await
        .unwrap();
    let read = call(&w.deps, "alice", "GET /webhooks/endpoints/{endpoint_id}", Some(&id), None);
    let view = json_of(&read.await);
    assert_eq!(view["status"], "disabled");
    assert_eq!(view["disabled_reason"], "gone");
    assert_eq!(view["disabled_at"], json!(at));
    assert_eq!(view["failing_since"], json!(at));

    w.clock.advance(std::time::Duration::from_secs(60));
    let response = call(&w.deps, "alice", route, Some(&id), None).await;
    assert_eq!(response.status(), 200);
    let view = json_of(&response);
    assert_eq!(view["status"], "enabled");
    for gone in ["disabled_reason", "disabled_at", "failing_since"] {
        assert!(view.get(gone).is_none(), "{gone}: {view}");
    }
    assert_eq!(view["updated_at"], json!(Timestamp::from(w.clock.now())));
}

/// Endpoints in memory on which the next `losses` spec writes lose to a change made
/// between their read and their write (another description, a new version).
#[derive(Debug)]
struct Racing {
    inner: std::sync::Arc<MemoryEndpoints>,
    losses: AtomicUsize,
}

impl Warm for Racing {}

#[async_trait]
impl EndpointStore for Racing {
    async fn create_endpoint(&self, record: &EndpointRecord, max: u32) -> Result<bool, StoreError> {
        self.inner.create_endpoint(record, max).await
    }
    async fn endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        self.inner.endpoint(owner, id).await
    }
    async fn endpoints(&self, owner: &Owner) -> Result<Vec<EndpointRecord>, StoreError> {
        self.inner.endpoints(owner).await
    }
    async fn replace_endpoint_spec(
        &self,
        record: &EndpointRecord,
        read: u64,
    ) -> Result<bool, StoreError> {
        if self
            .losses
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            let mut other = self.inner.endpoint(&record.owner, &record.endpoint_id).await?.unwrap();
            let version = other.version;
            other.spec.description = Some(format!("changed by another request ({version})"));
            other.version += 1;
            assert!(self.inner.replace_endpoint_spec(&other, version).await?);
        }
        self.inner.replace_endpoint_spec(record, read).await
    }
    async fn enable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        now: Timestamp,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        self.inner.enable_endpoint(owner, id, now).await
    }
    async fn delete_endpoint(&self, owner: &Owner, id: &EndpointId) -> Result<bool, StoreError> {
        self.inner.delete_endpoint(owner, id).await
    }
}

#[tokio::test]
async fn a_patch_that_loses_races_is_reapplied_and_after_three_losses_is_409() {
    let w = world();
    let id = created(&w.deps, "alice", &spec()).await;
    let racing = std::sync::Arc::new(Racing { inner: w.endpoints.clone(), losses: 2.into() });
    let deps = Deps { endpoints: racing.clone(), ..w.deps.clone() };
    let route = "PATCH /webhooks/endpoints/{endpoint_id}";
    let patch = json!({"events": ["job.progress"]});
    let response = call(&deps, "alice", route, Some(&id), Some(&patch)).await;
    assert_eq!(response.status(), 200, "{}", json_of(&response));
    let view = json_of(&response);
    assert_eq!(view["events"], json!(["job.progress"]), "the patch is applied");
    assert_eq!(view["description"], "changed by another request (2)", "over the others' change");
    let stored = stored(&w, "alice").await.remove(0);
    assert_eq!(stored.version, 4, "two other changes, then this one");
    assert_eq!(view, crate::view::endpoint(&stored));

    racing.losses.store(3, Ordering::SeqCst);
    let patch = json!({"events": ["job.failed"]});
    let response = call(&deps, "alice", route, Some(&id), Some(&patch)).await;
    problem(&response, 409, "endpoint-changing");
    let now = w.endpoints.endpoint(&owner("alice"), &id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(now.spec.events.len(), 1);
    assert!(!now.spec.receives(longhaul_domain::endpoints::EndpointEvent::JobFailed));
}

#[tokio::test]
async fn a_failing_table_is_a_500_that_names_nothing_inside() {
    let w = world();
    let id = created(&w.deps, "alice", &spec()).await;
    w.endpoints.set_unavailable(true);
    for (route, body) in [
        ("POST /webhooks/endpoints", Some(spec())),
        ("GET /webhooks/endpoints", None),
        ("GET /webhooks/endpoints/{endpoint_id}", None),
        ("PATCH /webhooks/endpoints/{endpoint_id}", Some(json!({"events": ["job.failed"]}))),
        ("DELETE /webhooks/endpoints/{endpoint_id}", None),
        ("POST /webhooks/endpoints/{endpoint_id}/enable", None),
    ] {
        let endpoint = route.contains('{').then_some(id.as_str());
        let response = call(&w.deps, "alice", route, endpoint, body.as_ref()).await;
        let problem = problem(&response, 500, "internal");
        let text = problem.to_string();
        assert!(!text.contains("unavailable") && !text.contains("endpoint "), "{route}: {text}");
    }
}
