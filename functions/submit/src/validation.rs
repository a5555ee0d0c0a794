//! Checking what a request asks for: an enabled kind and params it accepts, a callback URL
//! that may be called.

use longhaul_aws::api::Problem;
use longhaul_aws::callbacks::check_host;
use longhaul_domain::callback::{CallbackPolicy, parse_callback_url};
use longhaul_worker::{DynKind, Registry};

/// The enabled kind `job_type` names and the uploads `params` read, or the 422 that says why
/// not: an unknown or disabled kind (naming the enabled ones), or params the kind refuses.
pub(crate) fn check_spec<'d>(
    registry: &'d Registry,
    job_type: &str,
    params: &serde_json::Value,
) -> Result<(&'d dyn DynKind, Vec<String>), Problem> {
    let kind = registry.get(job_type).ok_or_else(|| {
        let known: Vec<String> = registry.names().iter().map(|n| format!("{n:?}")).collect();
        Problem::unprocessable(
            "unknown-job-type",
            "Unknown job type",
            format!(
                "unknown job type {:?}; this deployment accepts {}",
                job_type.chars().take(64).collect::<String>(),
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            ),
        )
    })?;
    let inputs = kind.check(params).map_err(|e| {
        Problem::unprocessable("invalid-params", "Invalid job parameters", e.to_string())
    })?;
    Ok((kind, inputs))
}

/// Validates a callback URL now (delivery checks again, against the address it connects
/// to): `https`, no credentials, and a host that is — and resolves only to — public
/// addresses ([`check_host`]). Returns the normalised URL.
pub(crate) async fn validate_callback_url(
    raw: &str,
    policy: &CallbackPolicy,
) -> Result<String, Problem> {
    let invalid = |detail: String| {
        Problem::unprocessable("invalid-callback-url", "Invalid callback URL", detail)
    };
    let url = parse_callback_url(raw, policy).map_err(|e| invalid(e.to_string()))?;
    check_host(&url, policy).await.map_err(|e| invalid(format!("The callback host {e}.")))?;
    Ok(url.as_str().to_owned())
}
