//! **uploads** — `POST /uploads`: a presigned PUT for one input file under the caller's own
//! prefix. The answer's `input` is what a job's params name; a job may only name the caller's
//! own uploads (checked at submission from the key alone). The caller declares the file's
//! size, at most `LONGHAUL_MAX_UPLOAD_BYTES`, and the URL signs it: S3 takes no other length.
//! The sizes a principal declares count against its daily quota
//! (`LONGHAUL_TENANT_UPLOAD_BYTES_PER_DAY`), so what one principal can store is bounded: an
//! upload is kept at most a week.

pub mod lambda;

use std::sync::Arc;
use std::time::Duration;

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_body, json_response, principal};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::limits::{Admission, UploadQuota};
use longhaul_aws::objects::ObjectStore;
use longhaul_aws::ports::{Clock, SystemClock, UploadLinks, UploadQuotas};
use longhaul_domain::uploads::{upload_key, validate_filename};
use serde::Deserialize;
use serde_json::json;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 4 * 1024;
/// How long an upload URL lives.
pub const UPLOAD_URL_TTL: Duration = Duration::from_secs(15 * 60);
/// The largest file one presigned PUT can carry (S3's limit for a single PUT, 5 GiB).
pub const S3_MAX_PUT_BYTES: u64 = 5 * 1024 * 1024 * 1024;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `BUCKET_NAME`: where uploads go.
    pub bucket: String,
    /// `LONGHAUL_MAX_UPLOAD_BYTES` (default and most: 5 GiB): the largest file accepted (at
    /// most the daily quota).
    pub max_upload_bytes: u64,
    /// `TABLE_NAME`: where the quota's counters are.
    pub table: String,
    /// `LONGHAUL_TENANT_UPLOAD_BYTES_PER_DAY` (default 100 GiB; 0: no quota): the bytes of
    /// uploads one principal may declare in a UTC day.
    pub upload_bytes_per_day: u64,
}

/// The default daily upload quota per principal: 100 GiB.
pub const DEFAULT_UPLOAD_BYTES_PER_DAY: u64 = 100 * 1024 * 1024 * 1024;

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let max_upload_bytes = vars.parsed_or("LONGHAUL_MAX_UPLOAD_BYTES", S3_MAX_PUT_BYTES)?;
        if !(1..=S3_MAX_PUT_BYTES).contains(&max_upload_bytes) {
            return Err(ConfigError::Invalid {
                name: "LONGHAUL_MAX_UPLOAD_BYTES".into(),
                value: max_upload_bytes.to_string(),
                reason: format!("must be between 1 and {S3_MAX_PUT_BYTES} (one S3 PUT)"),
            });
        }
        let upload_bytes_per_day =
            vars.parsed_or("LONGHAUL_TENANT_UPLOAD_BYTES_PER_DAY", DEFAULT_UPLOAD_BYTES_PER_DAY)?;
        // An upload larger than a day's quota could never be made: the quota bounds it too
        // (a 422 that says so, not a 429 whose retry would never succeed).
        let max_upload_bytes = match upload_bytes_per_day {
            0 => max_upload_bytes,
            quota => max_upload_bytes.min(quota),
        };
        Ok(Config {
            bucket: vars.required("BUCKET_NAME")?,
            max_upload_bytes,
            table: vars.required("TABLE_NAME")?,
            upload_bytes_per_day,
        })
    }
}

/// What the handler needs, built once per sandbox: its ports and its limit.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The bucket's upload links (presigning only; this function writes no object itself).
    pub objects: Arc<dyn UploadLinks>,
    /// The principals' daily quota of upload bytes.
    pub quota: Arc<dyn UploadQuotas>,
    /// The largest file accepted.
    pub max_upload_bytes: u64,
    /// What time it is: when a link handed out expires.
    pub clock: Arc<dyn Clock>,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the quota's table. Presigning is local: this function never calls S3 itself.
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![self.quota.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>]
    }

    /// Builds the AWS adapter from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            // Built at init, not on first use: every request presigns with it (local work, so
            // no warm-up call; building the client is all there is to warm).
            objects: Arc::new(ObjectStore::new(
                aws_sdk_s3::Client::new(sdk),
                config.bucket.clone(),
            )),
            quota: Arc::new(UploadQuota::new(
                aws_sdk_dynamodb::Client::new(sdk),
                config.table.clone(),
                config.upload_bytes_per_day,
            )),
            max_upload_bytes: config.max_upload_bytes,
            clock: Arc::new(SystemClock),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UploadBody {
    filename: String,
    content_type: String,
    size_bytes: u64,
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`longhaul_aws::logs`]) carrying the principal only: an upload
/// belongs to no job yet (no `job_id`, no `attempt`).
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    use tracing::Instrument;
    let span = longhaul_aws::logs::job_span(None, None, principal(&request).as_ref());
    create(deps, &request).instrument(span).await.unwrap_or_else(Problem::into_response)
}

async fn create(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let body: UploadBody =
        serde_json::from_value(json_body(request, MAX_BODY_BYTES)?).map_err(|e| {
            Problem::bad_request(format!("The body does not match the upload schema: {e}"))
        })?;
    validate_filename(&body.filename).map_err(|e| {
        Problem::unprocessable("invalid-filename", "Invalid file name", e.to_string())
    })?;
    let content_type: mime::Mime = body
        .content_type
        .parse()
        .ok()
        .filter(|_| (3..=255).contains(&body.content_type.len()) && body.content_type.is_ascii())
        .ok_or_else(|| {
            Problem::unprocessable(
                "invalid-content-type",
                "Invalid content type",
                "content_type must be a media type such as text/csv.",
            )
        })?;
    if body.size_bytes > deps.max_upload_bytes {
        return Err(Problem::unprocessable(
            "upload-too-large",
            "Upload too large",
            format!(
                "size_bytes is {}; the largest upload accepted is {} bytes.",
                body.size_bytes, deps.max_upload_bytes
            ),
        ));
    }
    charge(deps, &owner, body.size_bytes).await?;
    let key = upload_key(&owner, &uuid::Uuid::now_v7().to_string(), &body.filename);
    let (url, headers) = deps
        .objects
        .presign_put(&key, content_type.as_ref(), body.size_bytes, UPLOAD_URL_TTL)
        .await
        .map_err(|err| {
            tracing::error!(error = %err, "presigning an upload failed");
            Problem::internal()
        })?;
    let expires_at =
        deps.clock.now() + chrono::Duration::from_std(UPLOAD_URL_TTL).expect("15 minutes fits");
    let mut headers = headers;
    headers.entry("content-type".into()).or_insert_with(|| content_type.to_string());
    // Every HTTP client sets Content-Length from the body itself (browsers refuse to be told);
    // what matters is that the body is exactly `size_bytes` long, as the answer says.
    headers.remove("content-length");
    Ok(json_response(
        StatusCode::CREATED,
        &json!({
            "upload_url": url,
            "method": "PUT",
            "headers": headers,
            "input": key,
            "size_bytes": body.size_bytes,
            "expires_at": longhaul_domain::format_rfc3339(expires_at),
        }),
    ))
}

/// Counts `bytes` against `owner`'s daily quota, or refuses the upload (`429`, nothing
/// counted, `Retry-After` the next UTC day).
async fn charge(deps: &Deps, owner: &longhaul_domain::Owner, bytes: u64) -> Result<(), Problem> {
    match deps.quota.charge(owner, bytes).await {
        Ok(Admission::Admitted) => Ok(()),
        Ok(Admission::Limited { retry_after }) => {
            tracing::info!(bytes, retry_after, "upload refused: the tenant's daily quota is used");
            Err(Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "upload-quota",
                "Daily upload quota used",
                format!(
                    "This principal's uploads today leave no room for {bytes} more bytes; the quota renews at midnight UTC, in {retry_after} s."
                ),
            )
            .header(header::RETRY_AFTER, retry_after.to_string()))
        }
        Err(err) => {
            tracing::error!(error = %err, "counting an upload against its quota failed");
            Err(Problem::internal())
        }
    }
}

#[cfg(test)]
mod tests;
