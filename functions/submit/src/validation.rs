//! Checking what a request asks for: an enabled kind and params it accepts, a callback URL
//! that may be called.

use std::time::Duration;

use longhaul_aws::api::Problem;
use longhaul_domain::callback::{CallbackPolicy, Host, check_address, parse_callback_url};
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

/// How long resolving a callback host may take at submission.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Validates a callback URL now (delivery checks again, against the address it connects
/// to): `https`, no credentials, and a host that is — and resolves only to — public
/// addresses. Returns the normalised URL.
pub(crate) async fn validate_callback_url(
    raw: &str,
    policy: &CallbackPolicy,
) -> Result<String, Problem> {
    let invalid = |detail: String| {
        Problem::unprocessable("invalid-callback-url", "Invalid callback URL", detail)
    };
    let url = parse_callback_url(raw, policy).map_err(|e| invalid(e.to_string()))?;
    if let Host::Domain(name) = url.host() {
        let lookup = tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tokio::net::lookup_host((name.as_str(), url.port())),
        )
        .await;
        let addresses: Vec<_> = match lookup {
            Ok(Ok(addresses)) => addresses.collect(),
            _ => return Err(invalid(format!("The callback host {name} does not resolve."))),
        };
        if addresses.is_empty() {
            return Err(invalid(format!("The callback host {name} does not resolve.")));
        }
        for address in addresses {
            check_address(address.ip(), policy).map_err(|_| {
                invalid(format!("The callback host {name} resolves to a non-public address."))
            })?;
        }
    }
    Ok(url.as_str().to_owned())
}
