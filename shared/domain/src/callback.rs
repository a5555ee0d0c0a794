//! Partner callback URLs, and the guard against server-side request forgery (SSRF).
//!
//! A job may name a webhook that longhaul calls when the job settles. That turns longhaul into
//! a request forwarder: whoever submits a job chooses a URL, and our deliverer, which runs
//! inside our AWS account in a Lambda sandbox, sends a request to it. Left unchecked, that is
//! SSRF. Inside Lambda the prizes are:
//!
//! - the Lambda Runtime API on `127.0.0.1:9001`. A forged request can fetch the next
//!   invocation (someone else's job and its payload) or post a made-up answer for it.
//! - the function's IAM credentials. Any local or link-local credentials endpoint hands them
//!   to whoever asks (`169.254.169.254` and `169.254.170.2` if this code ever runs on EC2 or
//!   ECS), and VPC-attached functions can also reach private services (10/8, 172.16/12, ...).
//!
//! So a callback must point at the public internet and nowhere else. This module checks that
//! in two places:
//!
//! 1. **At submission**, [`parse_callback_url`] rejects anything that is not a plain absolute
//!    `https` URL with a public host. The `url` crate parses it the way browsers do (WHATWG),
//!    which turns the disguised spellings of an IPv4 address (`2130706433`, `0x7f.1`,
//!    `0177.0.0.1`, `127.1`) into the address they really mean. IP literals are checked on the
//!    spot with [`check_address`]. Host names that only resolve inside a private network
//!    (`localhost`, `*.local`, `*.internal`, single labels such as `intranet`) are refused.
//! 2. **At delivery**, the deliverer must pass *every* DNS answer for the host to
//!    [`check_address`] before it connects. Checking only at submission is not enough: a
//!    partner's name can resolve to a public address today and to `127.0.0.1` tomorrow, or
//!    even between two lookups a second apart (DNS rebinding). So the deliverer must also
//!    **connect to the address it checked**: resolve once, filter, and hand the checked
//!    address to the HTTP client, for example with a DNS resolver that drops non-public
//!    answers. It must not let the client look the name up again. TLS still uses the host name
//!    ([`CallbackUrl::host`]). Redirects must not be followed, or each `Location` must go
//!    through these same checks, and no proxy from the environment may be used.
//!
//! Nothing here does I/O. The local development stack sets
//! `LONGHAUL_ALLOW_INSECURE_CALLBACKS=1`, which maps to [`CallbackPolicy::allow_insecure`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::Url;

/// Longest accepted callback URL, in bytes, both as submitted and once normalised.
pub const MAX_CALLBACK_URL_LEN: usize = 2048;

/// Host-name suffixes that only mean something inside a private network. A host is refused if
/// it equals one of them or ends with `.` followed by one of them.
const PRIVATE_SUFFIXES: &[&str] = &["localhost", "local", "internal", "localdomain", "home.arpa"];

/// What callback targets are acceptable.
///
/// The default (`allow_insecure: false`) is the only policy for deployed stacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallbackPolicy {
    /// Local development only (`LONGHAUL_ALLOW_INSECURE_CALLBACKS=1`): also accept the `http`
    /// scheme, loopback addresses (127.0.0.0/8, `::1`, and `::ffff:127.0.0.0/104`) and the
    /// host name `localhost`. Private, link-local and every other non-public range stay
    /// refused.
    pub allow_insecure: bool,
}

/// A callback URL that passed [`parse_callback_url`]: absolute, `https` (or `http` under an
/// insecure policy), no credentials, no fragment, and a host that is a public IP address or a
/// host name that is not obviously private.
///
/// A host name still has to be resolved and each answer checked with [`check_address`] at
/// delivery time (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackUrl {
    url: Url,
    host: Host,
    port: u16,
}

/// The host of a [`CallbackUrl`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name in lower-case ASCII (international names in their `xn--` form), with no
    /// trailing dot. It must be resolved, and every answer passed to [`check_address`].
    Domain(String),
    /// An IP address literal. It has already passed [`check_address`].
    Ip(IpAddr),
}

/// Why a callback URL or address is refused. Each message tells the partner what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallbackUrlError {
    /// The text is not an absolute URL. The payload says what is wrong with it.
    #[error(
        "callback URL is not a valid absolute URL ({0}); expected something like https://hooks.example.com/longhaul"
    )]
    Malformed(String),
    /// The scheme is not `https`, or `http` under an insecure policy. The payload is the scheme.
    #[error("callback URL scheme `{0}` is not allowed; callbacks must use https")]
    SchemeNotAllowed(String),
    /// The URL is longer than [`MAX_CALLBACK_URL_LEN`] bytes.
    #[error("callback URL is longer than {MAX_CALLBACK_URL_LEN} bytes; shorten it")]
    TooLong,
    /// The URL has a `user:password@` part.
    #[error(
        "callback URL must not contain a user name or password; remove the `user:password@` part"
    )]
    HasCredentials,
    /// The URL has a `#fragment`. Fragments are never sent to a server, so one is a mistake.
    #[error("callback URL must not contain a fragment; remove everything from `#` on")]
    HasFragment,
    /// The URL has no host.
    #[error("callback URL has no host; expected something like https://hooks.example.com/longhaul")]
    MissingHost,
    /// The host name only resolves inside a private network: `localhost` and its subdomains,
    /// `.local`, `.internal`, `.localdomain` or `.home.arpa` names, and single-label names.
    /// The payload is the host.
    #[error(
        "callback host `{0}` is not allowed; use a fully qualified public DNS name (local, internal and single-label names are refused)"
    )]
    HostNotAllowed(String),
    /// The address is not a public internet address: loopback, private, link-local, shared,
    /// multicast, reserved, documentation, or an IPv6 form embedding one of those.
    #[error(
        "callback address {0} is not a public internet address; callbacks must reach a publicly routable host"
    )]
    AddressNotPublic(IpAddr),
}

impl CallbackUrl {
    /// The normalised URL as text, the form to store and to send the request to.
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// The host: a DNS name to resolve and check, or an IP address that was already checked.
    pub fn host(&self) -> Host {
        self.host.clone()
    }

    /// The port to connect to: the explicit port, otherwise the scheme's default (443 for
    /// `https`, 80 for `http`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The parsed URL.
    pub fn url(&self) -> &Url {
        &self.url
    }
}

impl fmt::Display for CallbackUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses and checks a partner's callback URL.
///
/// Accepts an absolute URL with the `https` scheme (`http` too if `policy.allow_insecure`), at
/// most [`MAX_CALLBACK_URL_LEN`] bytes, without whitespace or control characters, credentials
/// or fragment, and with a host. An IP literal host, in any spelling WHATWG accepts, must pass
/// [`check_address`]. A host name must have at least two labels and must not be `localhost`
/// (allowed only if `policy.allow_insecure`), a subdomain of it, or a name under `.local`,
/// `.internal`, `.localdomain` or `.home.arpa`.
///
/// The URL is normalised: scheme and host are lower-cased, a trailing dot on the host is
/// dropped, a default port is removed, and an IPv4 host is written in dotted decimal.
pub fn parse_callback_url(
    raw: &str,
    policy: &CallbackPolicy,
) -> Result<CallbackUrl, CallbackUrlError> {
    if raw.len() > MAX_CALLBACK_URL_LEN {
        return Err(CallbackUrlError::TooLong);
    }
    // WHATWG parsing quietly strips surrounding spaces and drops tabs and newlines anywhere.
    // Refuse them instead, so that what the partner sees is what we call.
    if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(CallbackUrlError::Malformed(
            "it contains whitespace or control characters".into(),
        ));
    }
    let mut url = Url::parse(raw).map_err(|e| CallbackUrlError::Malformed(e.to_string()))?;

    match url.scheme() {
        "https" => {}
        "http" if policy.allow_insecure => {}
        other => return Err(CallbackUrlError::SchemeNotAllowed(other.to_owned())),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(CallbackUrlError::HasCredentials);
    }
    if url.fragment().is_some() {
        return Err(CallbackUrlError::HasFragment);
    }

    let host = match url.host() {
        None => return Err(CallbackUrlError::MissingHost),
        Some(url::Host::Ipv4(ip)) => Host::Ip(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Host::Ip(IpAddr::V6(ip)),
        Some(url::Host::Domain(name)) => Host::Domain(check_domain(name, policy)?.to_owned()),
    };
    match &host {
        Host::Ip(ip) => check_address(*ip, policy)?,
        Host::Domain(name) => {
            if url.host_str() != Some(name.as_str()) {
                // Drop the trailing dot, so that TLS and Host see the name the certificate holds.
                url.set_host(Some(name)).map_err(|e| CallbackUrlError::Malformed(e.to_string()))?;
            }
        }
    }

    let port = match url.port_or_known_default() {
        Some(0) => return Err(CallbackUrlError::Malformed("port 0 is not a valid port".into())),
        Some(port) => port,
        // Only http and https get this far, and both have a default port.
        None => return Err(CallbackUrlError::Malformed("no port".into())),
    };
    if url.as_str().len() > MAX_CALLBACK_URL_LEN {
        return Err(CallbackUrlError::TooLong);
    }
    Ok(CallbackUrl { url, host, port })
}

/// Checks a host name (as the `url` crate normalised it) and returns it without its trailing dot.
fn check_domain<'a>(host: &'a str, policy: &CallbackPolicy) -> Result<&'a str, CallbackUrlError> {
    let name = host.strip_suffix('.').unwrap_or(host);
    let allowed = if name == "localhost" {
        policy.allow_insecure
    } else {
        // At least two labels, none of them empty, not under a private-use suffix.
        name.contains('.')
            && !name.split('.').any(str::is_empty)
            && !PRIVATE_SUFFIXES.iter().any(|suffix| {
                name.strip_suffix(suffix).is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
            })
    };
    if allowed { Ok(name) } else { Err(CallbackUrlError::HostNotAllowed(host.to_owned())) }
}

/// Checks that a callback may connect to `ip`: it must be a public unicast address.
///
/// The deliverer calls this on every DNS answer for a callback host, and connects only to an
/// address that passed. Refused:
///
/// - IPv4: "this network" 0.0.0.0/8 (including unspecified), loopback 127.0.0.0/8 (allowed if
///   `policy.allow_insecure`), private 10/8, 172.16/12 and 192.168/16, link-local 169.254/16
///   (including the metadata service 169.254.169.254), shared/CGNAT 100.64/10, IETF protocol
///   assignments 192.0.0/24, documentation 192.0.2/24, 198.51.100/24 and 203.0.113/24, the
///   6to4 relay anycast 192.88.99/24, benchmarking 198.18/15, multicast 224/4, reserved 240/4
///   and broadcast 255.255.255.255.
/// - IPv6: unspecified `::`, loopback `::1` (allowed if `policy.allow_insecure`), multicast
///   ff00::/8, unique-local fc00::/7, link-local fe80::/10, site-local fec0::/10, discard-only
///   100::/64, the IETF protocol assignments 2001::/23 (Teredo 2001::/32, benchmarking,
///   ORCHID), documentation 2001:db8::/32 and 3fff::/20, and anything outside global unicast
///   2000::/3.
/// - IPv6 forms with an embedded IPv4 address are judged by that address: IPv4-mapped
///   `::ffff:0:0/96` (`::ffff:127.0.0.1` is loopback), IPv4-compatible `::/96`, NAT64
///   `64:ff9b::/96` and 6to4 `2002::/16`. Only an IPv4-mapped loopback address counts as
///   loopback for `allow_insecure`. The others are never delivered locally, so a non-public
///   embedded address makes them non-public.
pub fn check_address(ip: IpAddr, policy: &CallbackPolicy) -> Result<(), CallbackUrlError> {
    let class = match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    };
    match class {
        Class::Public => Ok(()),
        Class::Loopback if policy.allow_insecure => Ok(()),
        Class::Loopback | Class::NonPublic => Err(CallbackUrlError::AddressNotPublic(ip)),
    }
}

/// Whether `ip` is a public internet address, that is, [`check_address`] under the strict
/// (default) policy accepts it.
pub fn is_public(ip: IpAddr) -> bool {
    check_address(ip, &CallbackPolicy { allow_insecure: false }).is_ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Public,
    Loopback,
    NonPublic,
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    if ip.is_loopback() {
        return Class::Loopback;
    }
    let non_public = in_v4(ip, Ipv4Addr::new(0, 0, 0, 0), 8) // "this network", incl. unspecified
        || ip.is_private() // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local() // 169.254/16
        || in_v4(ip, Ipv4Addr::new(100, 64, 0, 0), 10) // shared address space (CGNAT)
        || in_v4(ip, Ipv4Addr::new(192, 0, 0, 0), 24) // IETF protocol assignments
        || ip.is_documentation() // 192.0.2/24, 198.51.100/24, 203.0.113/24
        || in_v4(ip, Ipv4Addr::new(192, 88, 99, 0), 24) // 6to4 relay anycast
        || in_v4(ip, Ipv4Addr::new(198, 18, 0, 0), 15) // benchmarking
        || ip.is_multicast() // 224/4
        || ip.is_broadcast() // 255.255.255.255
        || in_v4(ip, Ipv4Addr::new(240, 0, 0, 0), 4); // reserved
    if non_public { Class::NonPublic } else { Class::Public }
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    if let Some(v4) = ip.to_ipv4_mapped() {
        // ::ffff:a.b.c.d is a.b.c.d on a dual-stack socket, loopback included.
        return classify_v4(v4);
    }
    if ip.is_loopback() {
        return Class::Loopback;
    }
    if ip.is_unspecified() {
        return Class::NonPublic;
    }
    let o = ip.octets();
    let embedded = |v4: Ipv4Addr| match classify_v4(v4) {
        Class::Public => Class::Public,
        Class::Loopback | Class::NonPublic => Class::NonPublic,
    };
    if in_v6(ip, Ipv6Addr::UNSPECIFIED, 96)
        || in_v6(ip, Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96)
    {
        // IPv4-compatible ::a.b.c.d and NAT64 64:ff9b::a.b.c.d
        return embedded(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    if in_v6(ip, Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16) {
        // 6to4 2002:aabb:ccdd::/48
        return embedded(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    let non_public = ip.is_multicast() // ff00::/8
        || ip.is_unique_local() // fc00::/7
        || ip.is_unicast_link_local() // fe80::/10
        || in_v6(ip, Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10) // site-local (deprecated)
        || in_v6(ip, Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64) // discard-only
        || in_v6(ip, Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23) // IETF protocol assignments, incl. Teredo 2001::/32
        || in_v6(ip, Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32) // documentation
        || in_v6(ip, Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20) // documentation (RFC 9637)
        || !in_v6(ip, Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3); // not global unicast
    if non_public { Class::NonPublic } else { Class::Public }
}

/// Whether `ip` lies in `net/len`.
fn in_v4(ip: Ipv4Addr, net: Ipv4Addr, len: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

/// Whether `ip` lies in `net/len`.
fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, len: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STRICT: CallbackPolicy = CallbackPolicy { allow_insecure: false };
    const INSECURE: CallbackPolicy = CallbackPolicy { allow_insecure: true };

    fn v4(s: &str) -> IpAddr {
        IpAddr::V4(s.parse().unwrap())
    }

    fn v6(s: &str) -> IpAddr {
        IpAddr::V6(s.parse().unwrap())
    }

    /// Every spelling of a forbidden address, and the address it must be recognised as.
    #[test]
    fn rejects_non_public_addresses_in_every_spelling() {
        let loopback = v4("127.0.0.1");
        let metadata = v4("169.254.169.254");
        let cases: &[(&str, IpAddr)] = &[
            ("https://127.0.0.1/", loopback),
            ("https://127.1/", loopback),
            ("https://2130706433/", loopback),
            ("https://0x7f000001/", loopback),
            ("https://0X7F000001/", loopback),
            ("https://0177.0.0.1/", loopback),
            ("https://017700000001/", loopback),
            ("https://0x7f.1/", loopback),
            ("https://0x7f.0.0.1/", loopback),
            ("https://127.0.0.1./", loopback),
            ("https://%31%32%37.0.0.1/", loopback),
            ("https://\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}/", loopback),
            ("https://127.0.0.1:9001/2018-06-01/runtime/invocation/next", loopback),
            ("HTTPS://127.0.0.1/", loopback),
            ("https:127.0.0.1/", loopback),
            ("https:\\\\127.0.0.1\\", loopback),
            ("https://127.255.255.254/", v4("127.255.255.254")),
            ("https://[::1]/", v6("::1")),
            ("https://[0:0:0:0:0:0:0:1]/", v6("::1")),
            ("https://[::ffff:127.0.0.1]/", v6("::ffff:127.0.0.1")),
            ("https://[::ffff:7f00:1]/", v6("::ffff:127.0.0.1")),
            ("https://[::127.0.0.1]/", v6("::127.0.0.1")),
            ("https://[2002:7f00:1::]/", v6("2002:7f00:1::")),
            ("https://[64:ff9b::7f00:1]/", v6("64:ff9b::127.0.0.1")),
            ("https://169.254.169.254/latest/meta-data", metadata),
            ("https://169.254.169.254/latest/meta-data/iam/security-credentials/", metadata),
            ("https://0xa9fea9fe/", metadata),
            ("https://2852039166/", metadata),
            ("https://[::ffff:169.254.169.254]/", v6("::ffff:a9fe:a9fe")),
            ("https://169.254.170.2/v2/credentials", v4("169.254.170.2")),
            ("https://[fd00::1]/", v6("fd00::1")),
            ("https://[fd00:ec2::254]/", v6("fd00:ec2::254")),
            ("https://[fe80::1]/", v6("fe80::1")),
            ("https://[fec0::1]/", v6("fec0::1")),
            ("https://100.64.0.1/", v4("100.64.0.1")),
            ("https://100.127.255.255/", v4("100.127.255.255")),
            ("https://10.0.0.1/", v4("10.0.0.1")),
            ("https://10.1/", v4("10.0.0.1")),
            ("https://[::ffff:10.0.0.1]/", v6("::ffff:10.0.0.1")),
            ("https://172.16.0.1/", v4("172.16.0.1")),
            ("https://172.31.255.255/", v4("172.31.255.255")),
            ("https://192.168.1.1/", v4("192.168.1.1")),
            ("https://0.0.0.0/", v4("0.0.0.0")),
            ("https://0/", v4("0.0.0.0")),
            ("https://0.1.2.3/", v4("0.1.2.3")),
            ("https://[::]/", v6("::")),
            ("https://224.0.0.1/", v4("224.0.0.1")),
            ("https://239.255.255.250/", v4("239.255.255.250")),
            ("https://[ff02::1]/", v6("ff02::1")),
            ("https://255.255.255.255/", v4("255.255.255.255")),
            ("https://240.0.0.1/", v4("240.0.0.1")),
            ("https://192.0.0.8/", v4("192.0.0.8")),
            ("https://192.0.2.1/", v4("192.0.2.1")),
            ("https://198.51.100.7/", v4("198.51.100.7")),
            ("https://203.0.113.9/", v4("203.0.113.9")),
            ("https://198.18.0.1/", v4("198.18.0.1")),
            ("https://198.19.255.255/", v4("198.19.255.255")),
            ("https://192.88.99.1/", v4("192.88.99.1")),
            ("https://[2001::1]/", v6("2001::1")),
            (
                "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
                v6("2001:0:4136:e378:8000:63bf:3fff:fdd2"),
            ),
            ("https://[2001:db8::1]/", v6("2001:db8::1")),
            ("https://[3fff::1]/", v6("3fff::1")),
            ("https://[100::1]/", v6("100::1")),
            ("https://[2002:a00:1::]/", v6("2002:a00:1::")),
            ("https://[64:ff9b::a9fe:a9fe]/", v6("64:ff9b::169.254.169.254")),
            ("https://[4000::1]/", v6("4000::1")),
        ];
        for (raw, ip) in cases {
            assert_eq!(
                parse_callback_url(raw, &STRICT),
                Err(CallbackUrlError::AddressNotPublic(*ip)),
                "{raw}"
            );
            assert!(!is_public(*ip), "{ip}");
        }
    }

    #[test]
    fn rejects_private_host_names() {
        let cases: &[(&str, &str)] = &[
            ("https://localhost/", "localhost"),
            ("https://LOCALHOST./", "localhost."),
            ("https://localhost:9001/", "localhost"),
            ("https://foo.localhost/", "foo.localhost"),
            ("https://a.b.localhost./", "a.b.localhost."),
            (
                "https://\u{24db}\u{24de}\u{24d2}\u{24d0}\u{24db}\u{24d7}\u{24de}\u{24e2}\u{24e3}/",
                "localhost",
            ),
            ("https://intranet/", "intranet"),
            ("https://intranet./", "intranet."),
            ("https://printer.local/", "printer.local"),
            ("https://metadata.google.internal/", "metadata.google.internal"),
            ("https://ip-10-0-0-1.ec2.internal/", "ip-10-0-0-1.ec2.internal"),
            ("https://host.localdomain/", "host.localdomain"),
            ("https://nas.home.arpa/", "nas.home.arpa"),
        ];
        for (raw, host) in cases {
            let expected = Err(CallbackUrlError::HostNotAllowed((*host).to_owned()));
            assert_eq!(parse_callback_url(raw, &STRICT), expected, "{raw}");
        }
        // allow_insecure admits `localhost` itself, nothing else.
        for raw in ["https://foo.localhost/", "https://intranet/", "https://printer.local/"] {
            assert!(
                matches!(
                    parse_callback_url(raw, &INSECURE),
                    Err(CallbackUrlError::HostNotAllowed(_))
                ),
                "{raw}"
            );
        }
    }

    #[test]
    fn rejects_malformed_and_disallowed_urls() {
        use CallbackUrlError::*;
        let scheme = |s: &str| SchemeNotAllowed(s.to_owned());
        let cases: &[(&str, CallbackUrlError)] = &[
            ("http://example.com/", scheme("http")),
            ("HTTP://example.com/", scheme("http")),
            ("ftp://example.com/", scheme("ftp")),
            ("ws://example.com/", scheme("ws")),
            ("file:///etc/passwd", scheme("file")),
            ("gopher://example.com:70/", scheme("gopher")),
            ("javascript:alert(1)", scheme("javascript")),
            ("data:text/plain,hello", scheme("data")),
            ("https://user:pw@example.com/", HasCredentials),
            ("https://user@example.com/", HasCredentials),
            ("https://:pw@example.com/", HasCredentials),
            ("https://user:pw@127.0.0.1/", HasCredentials),
            ("https://example.com/#", HasFragment),
            ("https://example.com/hook#frag", HasFragment),
        ];
        for (raw, expected) in cases {
            assert_eq!(parse_callback_url(raw, &STRICT).as_ref(), Err(expected), "{raw}");
        }
        let malformed = [
            "",
            "example.com/hook",
            "//example.com/hook",
            "/hook",
            "https://",
            "https:///",
            "https://[fe80::1%25eth0]/",
            "https://[::1",
            "https://1.2.3.4.5/",
            "https://256.0.0.1/",
            "https://0x100000000/",
            "https://example.com:0/",
            "https://example.com:99999/",
            "https://exa mple.com/",
            " https://example.com/",
            "https://example.com/ ",
            "https://exa\tmple.com/",
            "https://example.com/\nhook",
            "https://example.com/\u{0}",
            "https://exa%00mple.com/",
        ];
        for raw in malformed {
            assert!(
                matches!(parse_callback_url(raw, &STRICT), Err(Malformed(_))),
                "{raw:?}: {:?}",
                parse_callback_url(raw, &STRICT)
            );
        }
        for raw in ["https://example..com/", "https://.example.com/", "https://example.com../"] {
            assert!(parse_callback_url(raw, &STRICT).is_err(), "{raw}");
        }
    }

    #[test]
    fn length_limit() {
        let base = "https://example.com/";
        let longest = format!("{base}{}", "a".repeat(MAX_CALLBACK_URL_LEN - base.len()));
        assert!(parse_callback_url(&longest, &STRICT).is_ok());
        let too_long = format!("{longest}a");
        assert_eq!(parse_callback_url(&too_long, &STRICT), Err(CallbackUrlError::TooLong));
        // Short as submitted, too long once percent-encoded.
        let grows = format!("{base}{}", "\"".repeat(MAX_CALLBACK_URL_LEN / 2));
        assert!(grows.len() <= MAX_CALLBACK_URL_LEN);
        assert_eq!(parse_callback_url(&grows, &STRICT), Err(CallbackUrlError::TooLong));
    }

    #[test]
    fn accepts_public_urls() {
        let url = parse_callback_url("https://example.com/hook", &STRICT).unwrap();
        assert_eq!(url.as_str(), "https://example.com/hook");
        assert_eq!(url.host(), Host::Domain("example.com".into()));
        assert_eq!(url.port(), 443);
        assert_eq!(url.url().path(), "/hook");
        assert_eq!(url.to_string(), "https://example.com/hook");

        let url = parse_callback_url("https://93.184.216.34/x", &STRICT).unwrap();
        assert_eq!(url.host(), Host::Ip(v4("93.184.216.34")));
        assert_eq!(url.port(), 443);

        let url = parse_callback_url("https://[2606:2800:220:1::]/", &STRICT).unwrap();
        assert_eq!(url.host(), Host::Ip(v6("2606:2800:220:1::")));
        assert_eq!(url.as_str(), "https://[2606:2800:220:1::]/");

        let url = parse_callback_url("https://partner.example.com:8443/a?b=c", &STRICT).unwrap();
        assert_eq!(url.host(), Host::Domain("partner.example.com".into()));
        assert_eq!(url.port(), 8443);
        assert_eq!(url.url().query(), Some("b=c"));

        // Normalisation: case, trailing dot, default port, IDN, IPv4 spelling.
        let url = parse_callback_url("HTTPS://Partner.Example.COM.:443/Hook", &STRICT).unwrap();
        assert_eq!(url.as_str(), "https://partner.example.com/Hook");
        assert_eq!(url.host(), Host::Domain("partner.example.com".into()));
        let url = parse_callback_url("https://bücher.example/", &STRICT).unwrap();
        assert_eq!(url.host(), Host::Domain("xn--bcher-kva.example".into()));
        let url = parse_callback_url("https://0x5db8d822/", &STRICT).unwrap();
        assert_eq!(url.as_str(), "https://93.184.216.34/");
        // Names that merely contain a private word are fine; their DNS answers are checked later.
        for raw in [
            "https://localhost.example.com/",
            "https://local.example/",
            "https://mylocal.dev/",
            "https://127.0.0.1.nip.io/",
        ] {
            assert!(parse_callback_url(raw, &STRICT).is_ok(), "{raw}");
        }
        // Publicly routed addresses next to reserved ranges.
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.255",
            "192.88.98.255",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "::ffff:8.8.8.8",
            "2002:808:808::1",
            "64:ff9b::808:808",
            "2001:200::1",
            "2001:4860:4860::8888",
            "2a00:1450::1",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn insecure_policy_admits_only_http_and_loopback() {
        let url = parse_callback_url("http://127.0.0.1:8080/hook", &INSECURE).unwrap();
        assert_eq!(url.host(), Host::Ip(v4("127.0.0.1")));
        assert_eq!(url.port(), 8080);
        let url = parse_callback_url("http://localhost:9/", &INSECURE).unwrap();
        assert_eq!(url.host(), Host::Domain("localhost".into()));
        assert_eq!(url.port(), 9);
        let url = parse_callback_url("http://example.com/", &INSECURE).unwrap();
        assert_eq!(url.port(), 80);
        for raw in [
            "https://localhost/",
            "http://[::1]:3000/",
            "http://[::ffff:127.0.0.1]/",
            "http://2130706433/",
        ] {
            assert!(parse_callback_url(raw, &INSECURE).is_ok(), "{raw}");
        }

        let cases: &[(&str, IpAddr)] = &[
            ("http://10.0.0.1/", v4("10.0.0.1")),
            ("http://169.254.169.254/", v4("169.254.169.254")),
            ("http://192.168.1.1/", v4("192.168.1.1")),
            ("http://0.0.0.0/", v4("0.0.0.0")),
            ("http://[::]/", v6("::")),
            ("http://[fd00::1]/", v6("fd00::1")),
            ("http://[fe80::1]/", v6("fe80::1")),
            ("http://[2002:7f00:1::]/", v6("2002:7f00:1::")),
            ("http://[64:ff9b::7f00:1]/", v6("64:ff9b::7f00:1")),
            ("http://[::127.0.0.1]/", v6("::127.0.0.1")),
        ];
        for (raw, ip) in cases {
            assert_eq!(
                parse_callback_url(raw, &INSECURE),
                Err(CallbackUrlError::AddressNotPublic(*ip)),
                "{raw}"
            );
        }
        for raw in ["ftp://127.0.0.1/", "ws://localhost/"] {
            assert!(
                matches!(
                    parse_callback_url(raw, &INSECURE),
                    Err(CallbackUrlError::SchemeNotAllowed(_))
                ),
                "{raw}"
            );
        }
        assert!(parse_callback_url("http://user:pw@localhost/", &INSECURE).is_err());
    }

    #[test]
    fn messages_are_actionable() {
        let err = parse_callback_url("https://10.0.0.1/", &STRICT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "callback address 10.0.0.1 is not a public internet address; callbacks must reach a publicly routable host"
        );
        let err = parse_callback_url("http://example.com/", &STRICT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "callback URL scheme `http` is not allowed; callbacks must use https"
        );
        assert_eq!(
            CallbackUrlError::TooLong.to_string(),
            "callback URL is longer than 2048 bytes; shorten it"
        );
    }

    /// Non-public IPv4 ranges (network, prefix length). Kept apart from the implementation on
    /// purpose: this is the specification the properties check against.
    const V4_NON_PUBLIC: &[([u8; 4], u32)] = &[
        ([0, 0, 0, 0], 8),
        ([10, 0, 0, 0], 8),
        ([100, 64, 0, 0], 10),
        ([127, 0, 0, 0], 8),
        ([169, 254, 0, 0], 16),
        ([172, 16, 0, 0], 12),
        ([192, 0, 0, 0], 24),
        ([192, 0, 2, 0], 24),
        ([192, 88, 99, 0], 24),
        ([192, 168, 0, 0], 16),
        ([198, 18, 0, 0], 15),
        ([198, 51, 100, 0], 24),
        ([203, 0, 113, 0], 24),
        ([224, 0, 0, 0], 4),
        ([240, 0, 0, 0], 4),
    ];

    /// Non-public IPv6 ranges that do not embed an IPv4 address.
    const V6_NON_PUBLIC: &[([u16; 8], u32)] = &[
        ([0, 0, 0, 0, 0, 0, 0, 0], 128),
        ([0, 0, 0, 0, 0, 0, 0, 1], 128),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
    ];

    fn v4_in(net: [u8; 4], len: u32, bits: u32) -> Ipv4Addr {
        let host_mask = u32::MAX.checked_shr(len).unwrap_or(0);
        Ipv4Addr::from((u32::from_be_bytes(net) & !host_mask) | (bits & host_mask))
    }

    fn v6_in(net: [u16; 8], len: u32, bits: u128) -> Ipv6Addr {
        let host_mask = u128::MAX.checked_shr(len).unwrap_or(0);
        Ipv6Addr::from((u128::from(Ipv6Addr::from(net)) & !host_mask) | (bits & host_mask))
    }

    fn in_spec_v4(ip: Ipv4Addr) -> bool {
        V4_NON_PUBLIC.iter().any(|&(net, len)| v4_in(net, len, u32::from(ip)) == ip)
    }

    fn any_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<u32>().prop_map(|n| IpAddr::V4(Ipv4Addr::from(n))),
            any::<u128>().prop_map(|n| IpAddr::V6(Ipv6Addr::from(n))),
            (0..V4_NON_PUBLIC.len(), any::<u32>()).prop_map(|(i, bits)| {
                let (net, len) = V4_NON_PUBLIC[i];
                IpAddr::V4(v4_in(net, len, bits))
            }),
            (0..V6_NON_PUBLIC.len(), any::<u128>()).prop_map(|(i, bits)| {
                let (net, len) = V6_NON_PUBLIC[i];
                IpAddr::V6(v6_in(net, len, bits))
            }),
            any::<u32>().prop_map(|n| IpAddr::V6(Ipv4Addr::from(n).to_ipv6_mapped())),
            // Global unicast 2000::/3.
            any::<u128>().prop_map(|n| IpAddr::V6(Ipv6Addr::from((n >> 3) | (1 << 125)))),
        ]
    }

    proptest! {
        /// Every address of every non-public IPv4 range is refused; loopback only under the
        /// insecure policy.
        #[test]
        fn non_public_v4_ranges_are_rejected(i in 0..V4_NON_PUBLIC.len(), bits in any::<u32>()) {
            let (net, len) = V4_NON_PUBLIC[i];
            let ip = IpAddr::V4(v4_in(net, len, bits));
            prop_assert_eq!(check_address(ip, &STRICT), Err(CallbackUrlError::AddressNotPublic(ip)));
            prop_assert!(!is_public(ip));
            let loopback = net == [127, 0, 0, 0];
            prop_assert_eq!(check_address(ip, &INSECURE).is_ok(), loopback);
        }

        /// Every address of every non-public IPv6 range is refused; `::1` only under the
        /// insecure policy.
        #[test]
        fn non_public_v6_ranges_are_rejected(i in 0..V6_NON_PUBLIC.len(), bits in any::<u128>()) {
            let (net, len) = V6_NON_PUBLIC[i];
            let ip = IpAddr::V6(v6_in(net, len, bits));
            prop_assert_eq!(check_address(ip, &STRICT), Err(CallbackUrlError::AddressNotPublic(ip)));
            prop_assert_eq!(check_address(ip, &INSECURE).is_ok(), ip == v6("::1"));
        }

        /// The IPv4 verdict is exactly "not in one of the listed ranges".
        #[test]
        fn v4_verdict_matches_the_range_list(n in any::<u32>()) {
            let ip = Ipv4Addr::from(n);
            prop_assert_eq!(is_public(IpAddr::V4(ip)), !in_spec_v4(ip));
        }

        /// An IPv4-mapped IPv6 address gets the same verdict as its IPv4 address, under both
        /// policies.
        #[test]
        fn mapped_v6_has_the_verdict_of_its_v4(n in any::<u32>(), range in proptest::option::of((0..V4_NON_PUBLIC.len(), any::<u32>()))) {
            let ip = match range {
                Some((i, bits)) => v4_in(V4_NON_PUBLIC[i].0, V4_NON_PUBLIC[i].1, bits),
                None => Ipv4Addr::from(n),
            };
            let mapped = IpAddr::V6(ip.to_ipv6_mapped());
            for policy in [STRICT, INSECURE] {
                prop_assert_eq!(check_address(mapped, &policy).is_ok(), check_address(IpAddr::V4(ip), &policy).is_ok());
            }
        }

        /// IPv4-compatible, NAT64 and 6to4 addresses are public exactly when their embedded
        /// IPv4 address is (and never count as loopback).
        #[test]
        fn embedded_v4_is_judged_by_its_v4(n in any::<u32>(), range in proptest::option::of((0..V4_NON_PUBLIC.len(), any::<u32>())), rest in any::<u128>()) {
            let ip = match range {
                Some((i, bits)) => v4_in(V4_NON_PUBLIC[i].0, V4_NON_PUBLIC[i].1, bits),
                None => Ipv4Addr::from(n),
            };
            let bits = u128::from(u32::from(ip));
            let compatible = Ipv6Addr::from(bits);
            let nat64 = Ipv6Addr::from(u128::from(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0)) | bits);
            let six_to_four = Ipv6Addr::from((0x2002u128 << 112) | (bits << 80) | (rest & ((1 << 80) - 1)));
            let public = is_public(IpAddr::V4(ip));
            for embedded in [compatible, nat64, six_to_four] {
                if embedded == Ipv6Addr::UNSPECIFIED || embedded == Ipv6Addr::LOCALHOST {
                    continue; // `::` and `::1` are themselves, not IPv4-compatible addresses
                }
                prop_assert_eq!(is_public(IpAddr::V6(embedded)), public, "{}", embedded);
                prop_assert_eq!(check_address(IpAddr::V6(embedded), &INSECURE).is_ok(), public, "{}", embedded);
            }
        }

        /// Global unicast IPv6 outside the special-purpose blocks is public; everything outside
        /// 2000::/3 (bar embedded IPv4 forms) is not.
        #[test]
        fn v6_global_unicast_is_the_public_space(n in any::<u128>()) {
            let ip = Ipv6Addr::from(n);
            let in_net = |net: [u16; 8], len: u32| v6_in(net, len, n) == ip;
            let embeds_v4 = in_net([0, 0, 0, 0, 0, 0xffff, 0, 0], 96)
                || in_net([0; 8], 96)
                || in_net([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96)
                || in_net([0x2002, 0, 0, 0, 0, 0, 0, 0], 16);
            prop_assume!(!embeds_v4);
            let special = in_net([0x2001, 0, 0, 0, 0, 0, 0, 0], 23)
                || in_net([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32)
                || in_net([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20);
            let global = in_net([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);
            prop_assert_eq!(is_public(IpAddr::V6(ip)), global && !special);
        }

        /// `is_public` is `check_address` under the strict policy, and the insecure policy only
        /// ever adds loopback addresses.
        #[test]
        fn is_public_agrees_with_check_address(ip in any_ip()) {
            prop_assert_eq!(is_public(ip), check_address(ip, &STRICT).is_ok());
            prop_assert_eq!(is_public(ip), check_address(ip, &CallbackPolicy::default()).is_ok());
            if check_address(ip, &INSECURE).is_ok() && !is_public(ip) {
                let loopback = match ip {
                    IpAddr::V4(v4) => v4.is_loopback(),
                    IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
                };
                prop_assert!(loopback, "{}", ip);
            }
        }

        /// Decimal, hexadecimal and dotted-octal spellings of an IPv4 host are normalised and
        /// get the verdict of the address they denote.
        #[test]
        fn ipv4_spellings_are_normalised(n in any::<u32>(), range in proptest::option::of((0..V4_NON_PUBLIC.len(), any::<u32>()))) {
            let ip = match range {
                Some((i, bits)) => v4_in(V4_NON_PUBLIC[i].0, V4_NON_PUBLIC[i].1, bits),
                None => Ipv4Addr::from(n),
            };
            let [a, b, c, d] = ip.octets();
            let m = u32::from(ip);
            for host in [format!("{m}"), format!("0x{m:x}"), format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"), format!("{a}.{}", u32::from_be_bytes([0, b, c, d])), format!("[::ffff:{ip}]")] {
                let raw = format!("https://{host}/hook");
                let parsed = parse_callback_url(&raw, &STRICT);
                if is_public(IpAddr::V4(ip)) {
                    let url = parsed.map_err(|e| TestCaseError::fail(format!("{raw}: {e}")))?;
                    let expected = if host.starts_with('[') { IpAddr::V6(ip.to_ipv6_mapped()) } else { IpAddr::V4(ip) };
                    prop_assert_eq!(url.host(), Host::Ip(expected));
                } else {
                    prop_assert!(matches!(parsed, Err(CallbackUrlError::AddressNotPublic(_))), "{}: {:?}", raw, parsed);
                }
            }
        }

        /// Parsing never panics, and whatever it accepts satisfies the invariants.
        #[test]
        fn accepted_urls_satisfy_the_invariants(raw in prop_oneof![".{0,80}", "(https?|ftp)://[a-zA-Z0-9.:@\\[\\]%#?/-]{0,60}"], insecure in any::<bool>()) {
            let policy = CallbackPolicy { allow_insecure: insecure };
            if let Ok(url) = parse_callback_url(&raw, &policy) {
                let u = url.url();
                prop_assert!(u.scheme() == "https" || (insecure && u.scheme() == "http"));
                prop_assert!(u.username().is_empty() && u.password().is_none() && u.fragment().is_none());
                prop_assert!(url.as_str().len() <= MAX_CALLBACK_URL_LEN);
                prop_assert_eq!(Some(url.port()), u.port_or_known_default());
                match url.host() {
                    Host::Ip(ip) => prop_assert!(check_address(ip, &policy).is_ok()),
                    Host::Domain(name) => {
                        prop_assert!(!name.ends_with('.'));
                        prop_assert!(name.contains('.') || (insecure && name == "localhost"));
                    }
                }
            }
        }
    }
}
