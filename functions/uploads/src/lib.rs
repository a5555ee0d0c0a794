//! **uploads** — `POST /uploads`: a presigned PUT for one input file under the caller's own
//! prefix. The answer's `input` is what a job's params name; a job may only name the caller's
//! own uploads (checked at submission from the key alone).

use std::time::Duration;

use lambda_http::http::StatusCode;
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_body, json_response, principal};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::objects::ObjectStore;
use longhaul_domain::uploads::{upload_key, validate_filename};
use serde::Deserialize;
use serde_json::json;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 4 * 1024;
/// How long an upload URL lives.
pub const UPLOAD_URL_TTL: Duration = Duration::from_secs(15 * 60);

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `BUCKET_NAME`: where uploads go.
    pub bucket: String,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config { bucket: vars.required("BUCKET_NAME")? })
    }
}

/// What the handler needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The bucket (presigning only; this function writes nothing itself).
    pub objects: ObjectStore,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps { objects: ObjectStore::new(aws_sdk_s3::Client::new(sdk), config.bucket.clone()) }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UploadBody {
    filename: String,
    content_type: String,
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`longhaul_aws::logs`]) carrying the principal only: an upload
/// belongs to no job yet (no `job_id`, no `attempt`).
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    use tracing::Instrument;
    let span = longhaul_aws::logs::job_span(None, None, principal(&request).as_deref());
    create(deps, &request).instrument(span).await.unwrap_or_else(Problem::into_response)
}

async fn create(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let body: UploadBody = serde_json::from_value(json_body(request, MAX_BODY_BYTES)?)
        .map_err(|e| Problem::bad_request(format!("The body does not match the upload schema: {e}")))?;
    validate_filename(&body.filename)
        .map_err(|e| Problem::unprocessable("invalid-filename", "Invalid file name", e.to_string()))?;
    let content_type: mime::Mime = body
        .content_type
        .parse()
        .ok()
        .filter(|_| (3..=255).contains(&body.content_type.len()) && body.content_type.is_ascii())
        .ok_or_else(|| {
            Problem::unprocessable("invalid-content-type", "Invalid content type", "content_type must be a media type such as text/csv.")
        })?;
    let key = upload_key(&owner, &uuid::Uuid::now_v7().to_string(), &body.filename);
    let (url, headers) = deps.objects.presign_put(&key, content_type.as_ref(), UPLOAD_URL_TTL).await.map_err(|err| {
        tracing::error!(error = %err, "presigning an upload failed");
        Problem::internal()
    })?;
    let expires_at = chrono::Utc::now() + chrono::Duration::from_std(UPLOAD_URL_TTL).expect("15 minutes fits");
    let mut headers = headers;
    headers.entry("content-type".into()).or_insert_with(|| content_type.to_string());
    Ok(json_response(
        StatusCode::CREATED,
        &json!({
            "upload_url": url,
            "method": "PUT",
            "headers": headers,
            "input": key,
            "expires_at": longhaul_domain::format_rfc3339(expires_at),
        }),
    ))
}
