//! The handler over the in-memory adapters: reading and rotating secrets, and every refusal;
//! the secret records' own rules; and the test world the endpoint and delivery tests share.

use super::*;
use longhaul_domain::Owner;

use async_trait::async_trait;
use lambda_http::Body;
use longhaul_aws::jobs::{MAX_ACTIVE_SECRETS, Rotation, SecretsRecord, StoreError, WebhookSecret};
use longhaul_aws::ports::Warm;
use longhaul_domain::Timestamp;
use longhaul_domain::webhooks::ExposeSecret;
use longhaul_memory::api::{ApiRequest, json_of};
use longhaul_memory::{ManualClock, MemoryEndpoints, MemoryJobStore, MemoryWebhookQueue, owner};

fn t(text: &str) -> Timestamp {
    text.parse().expect("a test time")
}

fn secret(at: &str) -> WebhookSecret {
    WebhookSecret::generate(t(at)).unwrap()
}

fn exposed(record: &SecretsRecord) -> Vec<String> {
    record.secrets.iter().map(|s| s.secret.expose_secret().to_owned()).collect()
}

/// Three rotations within a day: never more than two secrets, the newest first, the
/// previous one kept until its overlap ends, the oldest retired.
#[test]
fn a_third_secret_within_the_overlap_retires_the_oldest() {
    let first = SecretsRecord { version: 1, secrets: vec![secret("2026-01-01T00:00:00Z")] };
    let second = first.rotated(
        secret("2026-01-01T01:00:00Z"),
        t("2026-01-01T01:00:00Z"),
        t("2026-01-02T01:00:00Z"),
    );
    assert_eq!(second.version, 2);
    assert_eq!(exposed(&second)[1], exposed(&first)[0]);
    assert_eq!(second.secrets[1].expires_at, Some(t("2026-01-02T01:00:00Z")));
    let third = second.rotated(
        secret("2026-01-01T02:00:00Z"),
        t("2026-01-01T02:00:00Z"),
        t("2026-01-02T02:00:00Z"),
    );
    assert_eq!(third.version, 3);
    assert_eq!(third.secrets.len(), MAX_ACTIVE_SECRETS);
    assert_eq!(exposed(&third)[1], exposed(&second)[0], "the previous one overlaps");
    assert!(!exposed(&third).contains(&exposed(&first)[0]), "the oldest is retired");
    assert_eq!(third.active(t("2026-01-01T02:00:00Z")).len(), 2);
    assert_eq!(third.active(t("2026-01-02T03:00:00Z")).len(), 1, "the overlap ends");
    // Once the overlap is over, a rotation keeps the one secret that still signs.
    let later = third.rotated(
        secret("2026-01-03T00:00:00Z"),
        t("2026-01-03T00:00:00Z"),
        t("2026-01-04T00:00:00Z"),
    );
    assert_eq!(exposed(&later)[1], exposed(&third)[0]);
}

#[test]
fn a_rotations_debug_output_shows_no_secret() {
    let record = SecretsRecord { version: 1, secrets: vec![secret("2026-01-01T00:00:00Z")] }
        .rotated(
            secret("2026-01-01T01:00:00Z"),
            t("2026-01-01T01:00:00Z"),
            t("2026-01-02T00:00:00Z"),
        );
    let text = format!("{:?}", Rotation::Rotated(record.clone()));
    for secret in exposed(&record) {
        assert!(!text.contains(&secret), "{text}");
    }
    assert!(text.contains("REDACTED"), "{text}");
}

// The handler.

/// The handler's ports in memory, and the handler's dependencies over them.
pub(crate) struct World {
    /// The secrets.
    pub(crate) jobs: Arc<MemoryJobStore>,
    /// Endpoints and their deliveries.
    pub(crate) endpoints: Arc<MemoryEndpoints>,
    /// The webhook queue.
    pub(crate) queue: Arc<MemoryWebhookQueue>,
    /// The handler's clock: standing still at the time the world was made, unless moved.
    pub(crate) clock: Arc<ManualClock>,
    pub(crate) deps: Deps,
}

/// How long a pending delivery goes untouched before a resend takes it as lost, in the tests.
pub(crate) const LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(11 * 3_600);

/// A world with no secrets, endpoints or deliveries, the strict callback policy (endpoint URLs
/// in the tests are public IP literals: nothing is looked up) and the default caps.
pub(crate) fn world() -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let endpoints = Arc::new(MemoryEndpoints::new());
    let queue = Arc::new(MemoryWebhookQueue::new());
    let clock = Arc::new(ManualClock::new());
    let deps = Deps {
        secrets: jobs.clone(),
        endpoints: endpoints.clone(),
        deliveries: endpoints.clone(),
        queue: queue.clone(),
        callbacks: CallbackPolicy { allow_insecure: false },
        max_endpoints: longhaul_domain::endpoints::DEFAULT_MAX_ENDPOINTS,
        record_retention: RecordRetention::default(),
        lost_after: LOST_AFTER,
        clock: clock.clone(),
    };
    World { jobs, endpoints, queue, clock, deps }
}

async fn get(deps: &Deps, owner: &Owner) -> Response<Body> {
    let request = ApiRequest::new("GET", "/webhooks/secret", owner).route("GET /webhooks/secret");
    handle(deps, request.build()).await
}

async fn rotate(deps: &Deps, owner: &Owner) -> Response<Body> {
    let request = ApiRequest::new("POST", "/webhooks/secret/rotate", owner)
        .route("POST /webhooks/secret/rotate");
    handle(deps, request.build()).await
}

/// The secrets of an answer, newest first, with when each stops signing.
fn secrets(response: &Response<Body>) -> Vec<(String, Option<String>)> {
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["cache-control"], "no-store", "secrets are never cached");
    json_of(response)["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert!(s["created_at"].is_string(), "{s}");
            (s["secret"].as_str().unwrap().to_owned(), s["expires_at"].as_str().map(str::to_owned))
        })
        .collect()
}

#[tokio::test]
async fn the_first_read_creates_a_secret_and_later_reads_show_it() {
    let w = world();
    let first = secrets(&get(&w.deps, &owner("alice")).await);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].1, None, "the only secret does not expire");
    assert!(!first[0].0.is_empty());
    assert_eq!(secrets(&get(&w.deps, &owner("alice")).await), first, "the same secret every time");
    let bob = secrets(&get(&w.deps, &owner("bob")).await);
    assert_ne!(bob[0].0, first[0].0, "each tenant has a secret of its own");
}

#[tokio::test]
async fn a_rotation_signs_with_a_new_secret_and_keeps_the_old_one_for_a_day() {
    let w = world();
    let old = secrets(&get(&w.deps, &owner("alice")).await)[0].0.clone();
    // The handler's clock, which stands still: the machine's would drift on a busy machine.
    let before = w.clock.now();
    let rotated = secrets(&rotate(&w.deps, &owner("alice")).await);
    assert_eq!(rotated.len(), 2);
    assert_ne!(rotated[0].0, old, "the new secret comes first");
    assert_eq!(rotated[0].1, None);
    assert_eq!(rotated[1].0, old, "the old one keeps signing");
    let until: chrono::DateTime<chrono::Utc> = rotated[1].1.as_deref().unwrap().parse().unwrap();
    let overlap = until - before;
    assert!(
        (chrono::Duration::hours(24) - chrono::Duration::seconds(1)
            ..=chrono::Duration::hours(24) + chrono::Duration::minutes(1))
            .contains(&overlap),
        "{overlap}"
    );
    assert_eq!(secrets(&get(&w.deps, &owner("alice")).await), rotated, "a read shows the rotation");
    assert_eq!(secrets(&get(&w.deps, &owner("bob")).await).len(), 1, "other tenants are untouched");
}

#[tokio::test]
async fn a_rotation_on_first_use_creates_the_secret_it_rotates() {
    let w = world();
    let rotated = secrets(&rotate(&w.deps, &owner("alice")).await);
    assert_eq!(rotated.len(), 2);
}

#[tokio::test]
async fn a_third_rotation_within_a_day_retires_the_oldest() {
    let w = world();
    let first = secrets(&get(&w.deps, &owner("alice")).await)[0].0.clone();
    let second = secrets(&rotate(&w.deps, &owner("alice")).await)[0].0.clone();
    let third = secrets(&rotate(&w.deps, &owner("alice")).await);
    assert_eq!(third.len(), MAX_ACTIVE_SECRETS);
    assert_eq!(third[1].0, second, "the previous one overlaps");
    assert!(third.iter().all(|(s, _)| *s != first), "the oldest no longer signs");
}

#[tokio::test]
async fn the_old_secret_is_shown_until_the_clock_passes_the_end_of_its_overlap() {
    use chrono::DurationRound;
    let w = world();
    // On a whole millisecond, as stored times are.
    let rotated_at = w.clock.now().duration_trunc(chrono::Duration::milliseconds(1)).unwrap();
    w.clock.set(rotated_at);
    let old = secrets(&get(&w.deps, &owner("alice")).await)[0].0.clone();
    let rotated = secrets(&rotate(&w.deps, &owner("alice")).await);
    let new = rotated[0].0.clone();
    let until: chrono::DateTime<chrono::Utc> = rotated[1].1.as_deref().unwrap().parse().unwrap();
    assert_eq!(until, rotated_at + chrono::Duration::hours(24), "a day after the rotation");
    w.clock.set(until - chrono::Duration::milliseconds(1));
    let shown = secrets(&get(&w.deps, &owner("alice")).await);
    assert_eq!((shown.len(), &shown[1].0), (2, &old), "still in its overlap");
    w.clock.set(until);
    let shown = secrets(&get(&w.deps, &owner("alice")).await);
    assert_eq!(shown, [(new, None)], "its overlap is over");
}

#[tokio::test]
async fn a_secret_past_its_overlap_is_not_shown() {
    let w = world();
    let old = secrets(&get(&w.deps, &owner("alice")).await)[0].0.clone();
    // A rotation whose overlap has ended.
    w.jobs
        .rotate_webhook_secret(&owner("alice"), "2000-01-01T00:00:00.000Z".parse().unwrap())
        .await
        .unwrap();
    let now = secrets(&get(&w.deps, &owner("alice")).await);
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].0, old);
}

/// A table on which every rotation loses to one stored at the same time.
#[derive(Debug)]
struct Raced(Arc<MemoryJobStore>);

#[async_trait]
impl Warm for Raced {}

#[async_trait]
impl WebhookSecrets for Raced {
    async fn webhook_secrets(&self, owner: &Owner) -> Result<SecretsRecord, StoreError> {
        self.0.webhook_secrets(owner).await
    }

    async fn rotate_webhook_secret(
        &self,
        owner: &Owner,
        overlap_until: Timestamp,
    ) -> Result<Rotation, StoreError> {
        // The other rotation is stored between this one's read and its write.
        match self.0.rotate_webhook_secret(owner, overlap_until).await? {
            Rotation::Rotated(winner) => Ok(Rotation::Lost(winner)),
            lost => Ok(lost),
        }
    }
}

#[tokio::test]
async fn a_rotation_that_loses_a_race_is_409_and_hands_out_no_secret() {
    let jobs = Arc::new(MemoryJobStore::new());
    let deps = Deps { secrets: Arc::new(Raced(jobs.clone())), ..world().deps };
    let response = rotate(&deps, &owner("alice")).await;
    assert_eq!(response.status(), 409);
    let problem = json_of(&response);
    assert_eq!(problem["type"], "/problems/rotation-conflict");
    let winner = exposed(&jobs.webhook_secrets(&owner("alice")).await.unwrap());
    let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
    for secret in &winner {
        assert!(!text.contains(secret.as_str()), "no secret in a conflict: {text}");
    }
    let shown: Vec<String> =
        secrets(&get(&deps, &owner("alice")).await).into_iter().map(|s| s.0).collect();
    assert_eq!(shown, winner, "a read shows the winner's secrets");
}

#[tokio::test]
async fn a_request_without_a_principal_is_401_and_creates_nothing() {
    let w = world();
    for request in [
        ApiRequest::new("GET", "/webhooks/secret", "alice").route("GET /webhooks/secret"),
        ApiRequest::new("POST", "/webhooks/secret/rotate", "alice")
            .route("POST /webhooks/secret/rotate"),
    ] {
        let response = handle(&w.deps, request.anonymous().build()).await;
        assert_eq!(response.status(), 401);
    }
    w.jobs.set_unavailable(true);
    // Nothing was read or written: the failing table was never asked.
    let request = ApiRequest::new("GET", "/webhooks/secret", "alice").route("GET /webhooks/secret");
    assert_eq!(handle(&w.deps, request.anonymous().build()).await.status(), 401);
}

#[tokio::test]
async fn a_principal_that_is_no_owner_is_answered_as_no_principal() {
    let w = world();
    // The table is never asked: a caller that is not an owner is no caller.
    w.jobs.set_unavailable(true);
    let anonymous = ApiRequest::new("GET", "/webhooks/secret", "alice")
        .route("GET /webhooks/secret")
        .anonymous();
    let expected = handle(&w.deps, anonymous.build()).await;
    assert_eq!(expected.status(), 401);
    let too_long = "a".repeat(Owner::MAX_BYTES + 1);
    for principal in ["", "alice\n", "\0", too_long.as_str()] {
        let request =
            ApiRequest::new("GET", "/webhooks/secret", principal).route("GET /webhooks/secret");
        let response = handle(&w.deps, request.build()).await;
        assert_eq!(response.status(), 401, "{principal:?}");
        assert_eq!(json_of(&response), json_of(&expected), "{principal:?}");
    }
}

#[tokio::test]
async fn a_failing_table_is_a_500_that_names_nothing_inside() {
    let w = world();
    let old = secrets(&get(&w.deps, &owner("alice")).await);
    w.jobs.set_unavailable(true);
    for response in [get(&w.deps, &owner("alice")).await, rotate(&w.deps, &owner("alice")).await] {
        assert_eq!(response.status(), 500);
        let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
        assert!(!text.contains("unavailable") && !text.contains("webhook secrets"), "{text}");
        assert!(!text.contains(old[0].0.as_str()), "{text}");
    }
    w.jobs.set_unavailable(false);
    assert_eq!(secrets(&get(&w.deps, &owner("alice")).await), old, "nothing was rotated");
}
