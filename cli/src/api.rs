//! The API client: bearer auth, JSON in and out, and RFC 9457 problems turned into
//! [`CliError::Api`].

use std::fmt;
use std::time::Duration;

use reqwest::header::{self, HeaderMap};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::CliError;

/// How long one JSON call may take, end to end.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A client of one deployment's API, acting as the token's principal.
pub struct Api {
    base: String,
    token: SecretString,
    http: reqwest::Client,
}

/// A successful answer, read whole.
#[derive(Debug)]
pub struct Reply {
    /// Its status code.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body as JSON (`Null` when empty).
    pub body: Value,
}

impl Reply {
    /// `Retry-After` in seconds, when the answer carries one.
    pub fn retry_after(&self) -> Option<Duration> {
        retry_after(&self.headers)
    }
}

/// `Retry-After` (delay-seconds form) of `headers`.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

impl Api {
    /// A client for the API at `base` with bearer `token`.
    pub fn new(base: &str, token: Option<&str>) -> Result<Api, CliError> {
        let token = token.filter(|t| !t.trim().is_empty()).ok_or_else(|| {
            CliError::Usage("no token: set LONGHAUL_TOKEN or pass --token".into())
        })?;
        let parsed = url::Url::parse(base)
            .map_err(|e| CliError::Usage(format!("--api / LONGHAUL_API {base:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(CliError::Usage(format!("--api / LONGHAUL_API {base:?}: not http(s)")));
        }
        Ok(Api {
            base: base.trim_end_matches('/').to_owned(),
            token: SecretString::from(token.trim().to_owned()),
            http: http_client()?,
        })
    }

    /// The client for URLs that are not the API (presigned S3 URLs, the event stream): no
    /// bearer token is ever sent there.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `path` (starting with `/`) under the API's base URL, or an absolute URL as given.
    pub fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_owned()
        } else {
            format!("{}{path}", self.base)
        }
    }

    /// A request to the API with the bearer token.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path)).bearer_auth(self.token.expose_secret())
    }

    /// Sends `request` and reads its JSON answer; an error status becomes [`CliError::Api`].
    pub async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<Reply, CliError> {
        let response =
            request.timeout(CALL_TIMEOUT).send().await.map_err(CliError::transport(what))?;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.map_err(CliError::transport(what))?;
        if status.is_client_error() || status.is_server_error() {
            return Err(CliError::Api(Box::new(Problem::from_answer(
                status.as_u16(),
                headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
                &bytes,
            ))));
        }
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .map_err(|e| CliError::Protocol(format!("{what}: the body is not JSON: {e}")))?
        };
        Ok(Reply { status, headers, body })
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Reply, CliError> {
        self.send(self.request(Method::GET, path), &format!("GET {path}")).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply, CliError> {
        self.send(self.request(Method::POST, path).json(body), &format!("POST {path}")).await
    }
}

/// The HTTP client: redirects are never followed automatically (the result's `303` is
/// followed by hand, without the bearer token).
fn http_client() -> Result<reqwest::Client, CliError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("longhaul-cli/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(CliError::transport("building the HTTP client"))
}

/// An API error as RFC 9457 describes it (`application/problem+json`), or as close as the
/// answer allows: a gateway's `{"message": …}` becomes the title, anything else the status's
/// reason phrase. The body is never shown raw.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Problem {
    /// The problem type (`/problems/<slug>`).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Short summary.
    pub title: Option<String>,
    /// HTTP status.
    pub status: Option<u16>,
    /// What happened in this case.
    pub detail: Option<String>,
    /// Extension members (`status_now`, `errors`…).
    #[serde(flatten)]
    pub extensions: Map<String, Value>,
}

impl Problem {
    /// The problem an error answer with `status`, `content_type` and `body` describes.
    pub fn from_answer(status: u16, content_type: Option<&str>, body: &[u8]) -> Problem {
        let is_problem = content_type.is_some_and(|c| c.starts_with("application/problem+json"));
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let mut problem = match parsed {
            Some(value) if is_problem => serde_json::from_value(value).unwrap_or_default(),
            Some(Value::Object(object)) => {
                let message = object.get("message").and_then(Value::as_str);
                Problem { title: message.map(str::to_owned), ..Problem::default() }
            }
            _ => Problem::default(),
        };
        problem.status = Some(status);
        if problem.title.is_none() {
            let reason = StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason());
            problem.title = Some(reason.unwrap_or("Error").to_owned());
        }
        problem
    }

    /// The HTTP status (0 if unknown).
    pub fn status(&self) -> u16 {
        self.status.unwrap_or(0)
    }

    /// The problem as one JSON object (for `--json`).
    pub fn to_json(&self) -> Value {
        let mut object = self.extensions.clone();
        for (name, value) in [
            ("type", self.kind.clone().map(Value::from)),
            ("title", self.title.clone().map(Value::from)),
            ("status", self.status.map(Value::from)),
            ("detail", self.detail.clone().map(Value::from)),
        ] {
            if let Some(value) = value {
                object.insert(name.into(), value);
            }
        }
        Value::Object(object)
    }

    /// A hint for what to do about it, when there is an obvious one.
    pub fn hint(&self) -> Option<&'static str> {
        match self.status() {
            401 => Some("check LONGHAUL_TOKEN / --token: it is missing, invalid or expired"),
            403 => Some("the token is valid but not allowed to do this"),
            410 => Some("the result is gone: it passed its retention and was deleted"),
            429 => Some("too many requests: wait and try again"),
            _ => None,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (HTTP {})", self.title.as_deref().unwrap_or("Error"), self.status())?;
        if let Some(detail) = self.detail.as_deref().filter(|d| !d.is_empty()) {
            write!(f, ": {detail}")?;
        }
        if let Some(now) = self.extensions.get("status_now").and_then(Value::as_str) {
            write!(f, " [job is {now}]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_renders_its_title_status_and_detail() {
        let body = br#"{"type":"/problems/wrong-status","title":"The job is not in a state that allows this","status":409,"detail":"the job has not succeeded yet","status_now":"running"}"#;
        let problem = Problem::from_answer(409, Some("application/problem+json"), body);
        assert_eq!(
            problem.to_string(),
            "The job is not in a state that allows this (HTTP 409): the job has not succeeded \
             yet [job is running]"
        );
        assert_eq!(problem.to_json()["type"], "/problems/wrong-status");
        assert_eq!(problem.to_json()["status_now"], "running");
    }

    #[test]
    fn a_gateway_message_becomes_the_title() {
        let problem =
            Problem::from_answer(401, Some("application/json"), br#"{"message":"Unauthorized"}"#);
        assert_eq!(problem.to_string(), "Unauthorized (HTTP 401)");
        assert!(problem.hint().unwrap().contains("LONGHAUL_TOKEN"));
    }

    #[test]
    fn an_unreadable_body_is_never_shown_raw() {
        let problem = Problem::from_answer(502, Some("text/html"), b"<html>secret stack</html>");
        assert_eq!(problem.to_string(), "Bad Gateway (HTTP 502)");
        let problem = Problem::from_answer(500, Some("application/problem+json"), b"[1]");
        assert_eq!(problem.to_string(), "Internal Server Error (HTTP 500)");
    }

    #[test]
    fn retry_after_reads_delay_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
    }
}
