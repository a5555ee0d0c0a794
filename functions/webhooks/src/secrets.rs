//! The caller's webhook signing secrets: `GET /webhooks/secret` (created on first use) and
//! `POST /webhooks/secret/rotate` (a new secret signs from now on; the previous one keeps
//! signing alongside it for 24 hours, so receivers can switch without a gap).
//!
//! At most two secrets are active ([`MAX_ACTIVE_SECRETS`]): a rotation within 24 hours of the
//! previous one retires the oldest at once. Rotations are conditional writes: of two at the
//! same time one wins and the other is answered `409` (`/problems/rotation-conflict`) — its
//! secret was never stored, so it is never handed out; `GET /webhooks/secret` shows the
//! winner's. Secrets are [`SecretString`](longhaul_domain::webhooks::SecretString)s, exposed
//! here only to be returned to their owner.

use std::time::Duration;

use lambda_http::http::StatusCode;
use lambda_http::{Body, Response};
use longhaul_aws::api::{Problem, json_response};
use longhaul_aws::jobs::{MAX_ACTIVE_SECRETS, Rotation, SecretsRecord};
use longhaul_domain::webhooks::ExposeSecret;
use longhaul_domain::{Owner, Timestamp};
use serde_json::json;

use crate::{Deps, internal, no_store};

/// How long a rotated-out secret keeps signing.
pub const ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// `GET /webhooks/secret`: the owner's secrets, the first one made now if it has none.
pub(crate) async fn get(deps: &Deps, owner: &Owner) -> Result<Response<Body>, Problem> {
    let record =
        deps.secrets.webhook_secrets(owner).await.map_err(internal("reading webhook secrets"))?;
    Ok(shown(deps, &record))
}

/// `POST /webhooks/secret/rotate`: a new secret, the previous one signing alongside it for
/// [`ROTATION_OVERLAP`].
pub(crate) async fn rotate(deps: &Deps, owner: &Owner) -> Result<Response<Body>, Problem> {
    let until =
        deps.clock.now() + chrono::Duration::from_std(ROTATION_OVERLAP).expect("a day fits");
    let rotation = deps
        .secrets
        .rotate_webhook_secret(owner, until.into())
        .await
        .map_err(internal("rotating a webhook secret"))?;
    match rotation {
        Rotation::Rotated(record) => Ok(shown(deps, &record)),
        Rotation::Lost(_) => {
            tracing::info!("a concurrent rotation won; this one was not stored");
            Err(rotation_conflict())
        }
    }
}

/// The answer of both routes: the secrets active now, never cached.
fn shown(deps: &Deps, record: &SecretsRecord) -> Response<Body> {
    no_store(json_response(StatusCode::OK, &render(record, deps.clock.now().into())))
}

/// 409: another rotation was stored between this one's read and its write.
fn rotation_conflict() -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "rotation-conflict",
        "Another rotation won",
        "Another rotation of your webhook secret was made at the same time and won; this one \
         was not made. GET /webhooks/secret shows the secrets that sign now.",
    )
}

/// The body of both routes, at `now`. The one place a secret is exposed outside signing: to
/// its owner.
pub(crate) fn render(record: &SecretsRecord, now: Timestamp) -> serde_json::Value {
    let secrets: Vec<_> = record
        .active(now)
        .into_iter()
        .take(MAX_ACTIVE_SECRETS)
        .map(|s| {
            json!({
                "secret": s.secret.expose_secret(),
                "created_at": s.created_at,
                "expires_at": s.expires_at,
            })
        })
        .collect();
    json!({ "secrets": secrets })
}
