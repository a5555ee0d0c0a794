//! A callback URL's host checked when a request names it (a job's `callback_url`, a webhook
//! endpoint's `url`): resolved now, and refused unless every address is one the policy
//! accepts.
//!
//! [`longhaul_domain::callback::parse_callback_url`] has already refused what the text alone
//! shows (scheme, credentials, private names, IP literals); this adds the one check that needs
//! the network, so a caller hears at once that its host does not resolve or points inside a
//! private network. It is not the SSRF guard: the deliverer resolves again and connects only
//! to the address it checked (DNS answers change), as the domain module describes.

use std::time::Duration;

use longhaul_domain::callback::{CallbackPolicy, CallbackUrl, Host, check_address};

/// How long resolving the host may take while a request waits.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a host was refused; the message names the host, for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeHost {
    /// No answer, an error, or no address within [`RESOLVE_TIMEOUT`].
    #[error("{0} does not resolve")]
    Unresolved(String),
    /// One of its addresses is not one `policy` accepts (private, loopback, link-local, …).
    #[error("{0} resolves to a non-public address")]
    NotPublic(String),
}

/// Resolves `url`'s host (an IP literal was checked when it was parsed) and checks every
/// address it resolves to against `policy`.
pub async fn check_host(url: &CallbackUrl, policy: &CallbackPolicy) -> Result<(), UnsafeHost> {
    let Host::Domain(name) = url.host() else {
        return Ok(());
    };
    let addresses: Vec<_> = {
        let lookup = tokio::net::lookup_host((name.as_str(), url.port()));
        match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
            Ok(Ok(addresses)) => addresses.collect(),
            _ => Vec::new(),
        }
    };
    if addresses.is_empty() {
        return Err(UnsafeHost::Unresolved(name));
    }
    if addresses.iter().any(|address| check_address(address.ip(), policy).is_err()) {
        return Err(UnsafeHost::NotPublic(name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_domain::callback::parse_callback_url;

    const INSECURE: CallbackPolicy = CallbackPolicy { allow_insecure: true };

    #[tokio::test]
    async fn an_ip_literal_needs_no_lookup_and_a_name_must_resolve_to_accepted_addresses() {
        let literal = parse_callback_url("https://93.184.215.14/hook", &CallbackPolicy::default());
        assert_eq!(check_host(&literal.unwrap(), &CallbackPolicy::default()).await, Ok(()));
        // `localhost` resolves to loopback, which only the insecure (local) policy accepts.
        let local = parse_callback_url("http://localhost:9/hook", &INSECURE).unwrap();
        assert_eq!(check_host(&local, &INSECURE).await, Ok(()));
        assert_eq!(
            check_host(&local, &CallbackPolicy::default()).await,
            Err(UnsafeHost::NotPublic("localhost".into()))
        );
        let nowhere = parse_callback_url("https://no-such-host.invalid/hook", &INSECURE).unwrap();
        let refused = check_host(&nowhere, &INSECURE).await.unwrap_err();
        assert_eq!(refused.to_string(), "no-such-host.invalid does not resolve");
    }
}
