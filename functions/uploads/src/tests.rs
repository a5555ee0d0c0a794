//! The handler over the in-memory bucket: the link it hands out and every refusal.

use super::*;

use longhaul_domain::uploads::{owner_prefix, owns_upload};
use longhaul_memory::api::{ApiRequest, json_of};
use longhaul_memory::{ManualClock, MemoryObjects, MemoryUploadQuota, owner};

const MAX: u64 = 1_000;
/// Each principal's daily quota: two and a half of the largest uploads.
const QUOTA: u64 = 2_500;

struct World {
    objects: Arc<MemoryObjects>,
    quota: Arc<MemoryUploadQuota>,
    /// The handler's clock: standing still at the time the world was made.
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn world() -> World {
    let objects = Arc::new(MemoryObjects::new());
    let clock = Arc::new(ManualClock::new());
    let quota = Arc::new(MemoryUploadQuota::new(QUOTA));
    let deps = Deps {
        objects: objects.clone(),
        quota: quota.clone(),
        max_upload_bytes: MAX,
        clock: clock.clone(),
    };
    World { objects, quota, clock, deps }
}

impl World {
    /// `POST /uploads` from `principal`, as API Gateway passes it.
    async fn upload(&self, principal: &str, body: serde_json::Value) -> Response<Body> {
        handle(&self.deps, ApiRequest::new("POST", "/uploads", principal).json(&body).build()).await
    }
}

fn csv(size: u64) -> serde_json::Value {
    json!({"filename": "data.csv", "content_type": "text/csv", "size_bytes": size})
}

fn problem_type(response: &Response<Body>) -> String {
    json_of(response)["type"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_valid_request_gets_a_put_link_under_the_callers_own_prefix() {
    let w = world();
    let before = chrono::Utc::now();
    let response = w.upload("alice", csv(11)).await;
    assert_eq!(response.status(), 201);
    let body = json_of(&response);
    let input = body["input"].as_str().unwrap();
    assert!(input.starts_with(&owner_prefix(&owner("alice"))), "{input}");
    assert!(input.ends_with("/data.csv"), "{input}");
    assert!(owns_upload(&owner("alice"), input), "a job of alice's may name it");
    assert!(!owns_upload(&owner("mallory"), input), "no one else's may");
    assert_eq!(body["method"], "PUT");
    let url = body["upload_url"].as_str().unwrap();
    assert!(url.contains(&format!("/{input}?")), "the link writes the input's key: {url}");
    assert!(url.contains("X-Amz-Expires=900"), "{url}");
    assert_eq!(body["headers"]["content-type"], "text/csv", "the signed type is sent");
    assert!(body["headers"].get("content-length").is_none(), "clients set the length");
    assert_eq!(body["size_bytes"], 11);
    let expires: chrono::DateTime<chrono::Utc> =
        body["expires_at"].as_str().unwrap().parse().unwrap();
    let lifetime = expires - before;
    assert!(
        (chrono::Duration::minutes(14)..=chrono::Duration::minutes(16)).contains(&lifetime),
        "{lifetime}"
    );
    assert!(w.objects.keys().is_empty(), "presigning writes nothing");
}

#[tokio::test]
async fn a_link_expires_its_lifetime_after_the_clocks_time() {
    let w = world();
    // A time the machine's clock is not at: the handler reads the clock it is given.
    let at: longhaul_domain::Timestamp = "2031-02-03T04:05:06.789Z".parse().unwrap();
    w.clock.set(at.as_datetime());
    let response = w.upload("alice", csv(1)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(json_of(&response)["expires_at"], "2031-02-03T04:20:06.789Z");
}

#[tokio::test]
async fn each_request_gets_a_key_of_its_own() {
    let w = world();
    let first = json_of(&w.upload("alice", csv(1)).await)["input"].clone();
    let second = json_of(&w.upload("alice", csv(1)).await)["input"].clone();
    assert_ne!(first, second);
    let bob = json_of(&w.upload("bob", csv(1)).await)["input"].as_str().unwrap().to_owned();
    assert!(
        bob.starts_with(&owner_prefix(&owner("bob"))) && !owns_upload(&owner("alice"), &bob),
        "{bob}"
    );
}

#[tokio::test]
async fn a_content_type_with_parameters_is_signed_as_given() {
    let w = world();
    let body =
        json!({"filename": "a.txt", "content_type": "text/plain; charset=utf-8", "size_bytes": 3});
    let response = w.upload("alice", body).await;
    assert_eq!(response.status(), 201);
    assert_eq!(json_of(&response)["headers"]["content-type"], "text/plain; charset=utf-8");
}

#[tokio::test]
async fn the_largest_upload_is_accepted_and_one_byte_more_is_not() {
    let w = world();
    assert_eq!(w.upload("alice", csv(MAX)).await.status(), 201);
    assert_eq!(w.upload("alice", csv(0)).await.status(), 201, "an empty file is a file");
    let response = w.upload("alice", csv(MAX + 1)).await;
    assert_eq!(response.status(), 422);
    assert_eq!(problem_type(&response), "/problems/upload-too-large");
    assert!(json_of(&response)["detail"].as_str().unwrap().contains(&MAX.to_string()));
}

#[tokio::test]
async fn bad_file_names_are_refused() {
    let w = world();
    let long = "x".repeat(256);
    for name in ["", ".", "..", "a/b.csv", "a\\b.csv", "a\nb", long.as_str()] {
        let body = json!({"filename": name, "content_type": "text/csv", "size_bytes": 1});
        let response = w.upload("alice", body).await;
        assert_eq!(response.status(), 422, "{name:?}");
        assert_eq!(problem_type(&response), "/problems/invalid-filename", "{name:?}");
    }
}

#[tokio::test]
async fn bad_content_types_are_refused() {
    let w = world();
    let long = format!("text/{}", "x".repeat(251));
    for content_type in ["", "csv", "a/", "text/ csv", "text/çsv", long.as_str()] {
        let body = json!({"filename": "a.csv", "content_type": content_type, "size_bytes": 1});
        let response = w.upload("alice", body).await;
        assert_eq!(response.status(), 422, "{content_type:?}");
        assert_eq!(problem_type(&response), "/problems/invalid-content-type", "{content_type:?}");
    }
}

#[tokio::test]
async fn bodies_that_do_not_match_the_schema_are_400() {
    let w = world();
    for body in [
        json!({"filename": "a.csv", "content_type": "text/csv"}),
        json!({"filename": "a.csv", "content_type": "text/csv", "size_bytes": 1, "acl": "public"}),
        json!({"filename": "a.csv", "content_type": "text/csv", "size_bytes": -1}),
        json!({"filename": "a.csv", "content_type": "text/csv", "size_bytes": "1"}),
        json!({"filename": 5, "content_type": "text/csv", "size_bytes": 1}),
        json!(["a.csv"]),
    ] {
        let response = w.upload("alice", body.clone()).await;
        assert_eq!(response.status(), 400, "{body}");
        assert_eq!(problem_type(&response), "/problems/bad-request", "{body}");
    }
}

#[tokio::test]
async fn what_is_not_a_json_body_is_refused() {
    let w = world();
    let not_json = ApiRequest::new("POST", "/uploads", "alice")
        .header("content-type", "application/json")
        .raw_body(b"{not json");
    assert_eq!(handle(&w.deps, not_json.build()).await.status(), 400);
    let text = ApiRequest::new("POST", "/uploads", "alice")
        .header("content-type", "text/plain")
        .raw_body(csv(1).to_string().as_bytes());
    assert_eq!(handle(&w.deps, text.build()).await.status(), 415);
    let big = json!({"filename": "a.csv", "content_type": "text/csv", "size_bytes": 1,
        "padding": "x".repeat(MAX_BODY_BYTES)});
    assert_eq!(w.upload("alice", big).await.status(), 413);
}

#[tokio::test]
async fn a_request_without_a_principal_is_401() {
    let w = world();
    let request = ApiRequest::new("POST", "/uploads", "alice").anonymous().json(&csv(1));
    assert_eq!(handle(&w.deps, request.build()).await.status(), 401);
}

#[tokio::test]
async fn a_failing_presigner_is_a_500_that_names_nothing_inside() {
    let w = world();
    w.objects.set_unavailable(true);
    let response = w.upload("alice", csv(1)).await;
    assert_eq!(response.status(), 500);
    let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
    assert!(!text.contains("unavailable") && !text.contains("presign"), "{text}");
    assert!(!text.contains("uploads/"), "no key leaks: {text}");
}

#[tokio::test]
async fn each_principal_declares_at_most_its_daily_quota_of_bytes() {
    let w = world();
    assert_eq!(w.upload("alice", csv(MAX)).await.status(), 201);
    assert_eq!(w.upload("alice", csv(MAX)).await.status(), 201);
    let refused = w.upload("alice", csv(MAX)).await;
    assert_eq!(refused.status(), 429, "2,000 of 2,500 bytes used: 1,000 more do not fit");
    assert_eq!(problem_type(&refused), "/problems/upload-quota");
    let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry_after), "the next UTC day: {retry_after}");
    assert_eq!(w.upload("alice", csv(500)).await.status(), 201, "what fits still does");
    assert_eq!(w.upload("bob", csv(MAX)).await.status(), 201, "each principal has its own");
}

#[tokio::test]
async fn a_failing_quota_is_a_500_that_names_nothing_inside() {
    let w = world();
    w.quota.set_unavailable(true);
    let response = w.upload("alice", csv(1)).await;
    assert_eq!(response.status(), 500);
    let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
    assert!(!text.contains("unavailable") && !text.contains("bytes"), "{text}");
}

#[test]
fn a_quota_below_the_largest_upload_lowers_it() {
    let vars = |quota: &str| {
        longhaul_aws::config::Vars::from_map(std::collections::HashMap::from([
            ("BUCKET_NAME".to_owned(), "b".to_owned()),
            ("TABLE_NAME".to_owned(), "t".to_owned()),
            ("LONGHAUL_MAX_UPLOAD_BYTES".to_owned(), "1000".to_owned()),
            ("LONGHAUL_TENANT_UPLOAD_BYTES_PER_DAY".to_owned(), quota.to_owned()),
        ]))
    };
    let of = |quota: &str| {
        let config = Config::from_vars(&vars(quota)).unwrap();
        (config.upload_bytes_per_day, config.max_upload_bytes)
    };
    assert_eq!(of("0"), (0, 1000), "no quota");
    assert_eq!(of("1000"), (1000, 1000));
    assert_eq!(of("999"), (999, 999), "an upload over a day's quota could never be made");
    assert!(Config::from_vars(&vars("lots")).is_err());
}
