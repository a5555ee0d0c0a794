//! The API client: bearer auth, JSON in and out, and RFC 9457 problems turned into
//! [`CliError::Api`].

use std::time::Duration;

use reqwest::header::{self, HeaderMap};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::error::CliError;
use crate::problem::Problem;

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

    /// `POST path` without a body (the API's actions that take none, or an optional one).
    pub async fn post_empty(&self, path: &str) -> Result<Reply, CliError> {
        self.send(self.request(Method::POST, path), &format!("POST {path}")).await
    }

    /// `PATCH path` with a JSON (merge) body.
    pub async fn patch(&self, path: &str, body: &Value) -> Result<Reply, CliError> {
        self.send(self.request(Method::PATCH, path).json(body), &format!("PATCH {path}")).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Result<Reply, CliError> {
        self.send(self.request(Method::DELETE, path), &format!("DELETE {path}")).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_delay_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
    }
}
